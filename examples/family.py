"""A parent with children: the roster, the children's outcomes, and cancelling one of them.

REDISBUS_URL=redis://localhost:6379/0 python examples/family.py
"""

from __future__ import annotations

import os
import uuid

from redisbus import Bus

url = os.environ.get("REDISBUS_URL")
bus = Bus.from_url(url) if url else Bus.embedded()
ch = bus.channel(f"example-family-{uuid.uuid4().hex[:6]}", routing="family", siblings=True)

lead = ch.join("lead")
kids = {n: ch.join(n, parent="lead") for n in ("researcher", "writer", "critic")}

print("lead's roster:", [(m.name, m.relationship, m.status) for m in lead.agents().family])
print("writer's roster:", [(m.name, m.relationship) for m in kids["writer"].agents().family])

kids["researcher"].send("writer", "three sources on neo-80s palettes")  # siblings may talk
kids["researcher"].complete("found three sources")
kids["writer"].complete("scene 3 written")
lead.cancel("critic", reason="no review needed this time")  # parent only; cascades

assert kids["critic"].wait(timeout=5).kind == "cancelled"
for outcome in lead.wait_children(timeout=10):
    print(f"outcome from {outcome.sender}: {outcome.body}")
print("tree:", [(m.name, m.parent, m.status) for m in ch.tree()])
bus.close()
