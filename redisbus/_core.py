"""Everything the sync and async faces share that does no I/O, under one name: checking and
planning what a call sends, and the parsing of what comes back. A face only decides *how* to
wait on the network. How each script is called (its KEYS, ARGV and reply) is in
``_bindings``, one binding per script. The code lives in modules named for what they hold:

- ``_channels``: channel configuration and limits, janitor and dead-letter reports
- ``_sending``:  send and batch arguments, send replies and receipts, outcome signatures
- ``_messages``: stream entries -> messages, who an entry is for, read/list (view.lua)
- ``_roster``:   members, the family an agent sees, the tree, card ranking
- ``_errors``:   script refusals -> the typed error tree
"""

from ._channels import (
    LIMITS,
    ChannelConfig,
    ChannelLimits,
    Routing,
    SweepReport,
    config_from_hash,
    dead_letter_fault,
    parse_channel,
    parse_dead_letters,
    plan_channel,
)
from ._errors import raise_if_refused, refusal
from ._filters import id_before
from ._messages import (
    VIEW_ENTRIES,
    ViewPlan,
    addressed_to,
    expired_at,
    fields_from_flat,
    message_from_fields,
    parse_view,
    plan_view,
    wait_kind,
)
from ._roster import members_from_hashes, new_agent_id, rank_cards, roster_of, tree_order
from ._sending import (
    SEND_BATCH,
    SENDABLE_TYPES,
    SendPlan,
    batch_calls,
    batch_results,
    parse_receipt,
    parse_send,
    plan_batch,
    plan_send,
    rejected_receipt,
    sign_outcome,
    split_replies,
    unbatch,
    with_durable,
)

__all__ = [
    "LIMITS",
    "SENDABLE_TYPES",
    "SEND_BATCH",
    "VIEW_ENTRIES",
    "ChannelConfig",
    "ChannelLimits",
    "Routing",
    "SendPlan",
    "SweepReport",
    "ViewPlan",
    "addressed_to",
    "batch_calls",
    "batch_results",
    "config_from_hash",
    "dead_letter_fault",
    "expired_at",
    "fields_from_flat",
    "id_before",
    "members_from_hashes",
    "message_from_fields",
    "new_agent_id",
    "parse_channel",
    "parse_dead_letters",
    "parse_receipt",
    "parse_send",
    "parse_view",
    "plan_batch",
    "plan_channel",
    "plan_send",
    "plan_view",
    "raise_if_refused",
    "rank_cards",
    "refusal",
    "rejected_receipt",
    "roster_of",
    "sign_outcome",
    "split_replies",
    "tree_order",
    "unbatch",
    "wait_kind",
    "with_durable",
]
