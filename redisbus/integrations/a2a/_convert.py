"""What the A2A bridge translates, with no I/O: cards, message text, task states, errors."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Artifact,
    HTTPAuthSecurityScheme,
    Message,
    Part,
    Role,
    SecurityRequirement,
    SecurityScheme,
    StringList,
    Task,
    TaskState,
    TaskStatus,
)
from a2a.utils.errors import (
    A2AError,
    ContentTypeNotSupportedError,
    InvalidParamsError,
    UnsupportedOperationError,
)
from google.protobuf.json_format import MessageToDict

from ... import __version__
from ..._errors import InvalidInput, LimitExceeded, RedisbusError, TooLarge, UnknownAgent
from ..._model import Member, Receipt

__all__ = [
    "BEARER",
    "INPUT_MODES",
    "agent_message",
    "card_for",
    "card_json",
    "external_name",
    "refusal",
    "state_of",
    "task_of",
    "text_of",
]

BEARER = "bearer"
# what a member takes in: text, and structured data parts (bridged as JSON text)
INPUT_MODES = ["text/plain", "application/json"]

# receipt status -> A2A task state (docs/a2a.md: the task follows the receipt)
STATES: dict[str, int] = {
    "queued": TaskState.TASK_STATE_SUBMITTED,
    "delivered": TaskState.TASK_STATE_WORKING,
    "read": TaskState.TASK_STATE_WORKING,
    "done": TaskState.TASK_STATE_COMPLETED,
    "rejected": TaskState.TASK_STATE_FAILED,
    "failed": TaskState.TASK_STATE_FAILED,
    "expired": TaskState.TASK_STATE_FAILED,
}
TERMINAL = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)


def card_for(member: Member, channel: str, url: str) -> AgentCard:
    """The A2A card of one channel member, from the card it published when it joined."""
    desc = member.description or f"{member.name}, a member of the redisbus channel {channel!r}"
    return AgentCard(
        name=member.name,
        description=desc,
        version=__version__,
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=INPUT_MODES,
        default_output_modes=["text/plain"],
        skills=[
            AgentSkill(id=s, name=s, description=f"{member.name}: {s}", tags=[s])
            for s in member.skills or ("message",)  # A2A wants at least one skill
        ],
        security_schemes={
            BEARER: SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="Bearer",
                    description="one token per caller; it names the caller on the bus",
                )
            )
        },
        security_requirements=[SecurityRequirement(schemes={BEARER: StringList()})],
    )


def card_json(card: AgentCard, *, v0_3: bool = False) -> dict[str, Any]:
    """The card as served: A2A 1.0 JSON. For 0.3 clients (``v0_3``), also the 0.3
    ``security`` list beside ``securityRequirements``: a client reading only the 0.3 name
    would otherwise report that no authentication is needed. Not in the 1.0 card: its JSON
    schema admits no other fields."""
    out: dict[str, Any] = agent_card_to_dict(card)
    if not v0_3:
        return out
    out["security"] = [
        {name: list(scopes.list) for name, scopes in req.schemes.items()}
        for req in card.security_requirements
    ]
    return out


def text_of(parts: Sequence[Part]) -> str:
    """A bus body from A2A parts: text as is, structured data as JSON; files are refused as
    a content type not supported (the bus carries text)."""
    out: list[str] = []
    for p in parts:
        kind = p.WhichOneof("content")
        if kind == "text":
            out.append(p.text)
        elif kind == "data":
            out.append(json.dumps(MessageToDict(p.data), ensure_ascii=False))
        else:  # a file (raw bytes or a URL): a content type the bus does not carry
            raise ContentTypeNotSupportedError(
                f"only text and data parts can be bridged, not {kind} "
                f"({p.media_type or 'no media type'})"
            )
    text = "\n".join(out)
    if not text.strip():
        raise InvalidParamsError("the message has no text")
    return text


def agent_message(text: str, *, task_id: str = "", context_id: str = "", **meta: Any) -> Message:
    m = Message(
        message_id=str(uuid.uuid4()),
        role=Role.ROLE_AGENT,
        parts=[Part(text=text)],
        task_id=task_id,
        context_id=context_id,
    )
    if meta:
        m.metadata.update({k: v for k, v in meta.items() if v is not None})
    return m


def state_of(receipt: Receipt | None, cancelled: bool) -> int:
    """A canceled task stays canceled (a terminal state) whatever its receipt says later."""
    if cancelled:
        return int(TaskState.TASK_STATE_CANCELED)
    if receipt is None:
        return int(TaskState.TASK_STATE_SUBMITTED)
    return int(STATES[receipt.status])


def task_of(
    task_id: str,
    context_id: str,
    state: int,
    status_message: Message | None,
    history: Iterable[Message],
    reply_text: str | None,
) -> Task:
    task = Task(
        id=task_id,
        context_id=context_id,
        status=TaskStatus(state=state),  # type: ignore[arg-type]
        history=list(history),
    )
    task.status.timestamp.GetCurrentTime()
    if status_message is not None:
        task.status.message.CopyFrom(status_message)
    if reply_text is not None:
        task.artifacts.append(
            Artifact(artifact_id=f"{task_id}/reply", name="reply", parts=[Part(text=reply_text)])
        )
    return task


def refusal(e: RedisbusError) -> A2AError:
    """A bus refusal as an A2A error: bad input -> invalid params; a limit, the pause switch,
    routing, a closed recipient -> unsupported operation (the bus refuses it now). ``data``
    carries the redisbus reason and, for limits, the numbers, so a client can act on them."""
    data: dict[str, Any] = {"reason": e.code}
    if isinstance(e, LimitExceeded):
        for k in ("limit", "current", "retry_after_s"):
            v = getattr(e, k)
            if v is not None:
                data[k] = str(v)
    text = f"{e.code}: {e}"
    if isinstance(e, InvalidInput | TooLarge | UnknownAgent):
        return InvalidParamsError(text, data=data)
    return UnsupportedOperationError(text, data=data)


def external_name(card_name: str) -> str:
    """A bus member name from an external agent's card name (printable, no spaces)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", card_name).strip("-.").lower()[:64]
    return name or "a2a-agent"
