"""Request/reply with agent.ask(): ask a helper, get its answer; other news waits its turn.

REDISBUS_URL=redis://localhost:6379/0 python examples/request_reply.py
python examples/request_reply.py          # no REDISBUS_URL: a private Redis for the run
"""

from __future__ import annotations

import os
import threading
import uuid

from redisbus import Agent, AskTimeout, Bus, Message

# a fresh channel per run: a second run never meets the first one's messages
CHANNEL = f"example-request-reply-{uuid.uuid4().hex[:6]}"


def helper(bus: Bus, ready: threading.Event) -> None:
    """Answers every request until it is asked to stop; meanwhile a colleague writes too."""
    ch = bus.channel(CHANNEL)
    me, colleague = ch.join("calculator"), ch.join("colleague")
    ready.set()

    def answer(agent: Agent, msg: Message) -> None:
        if msg.body == "stop":
            stop.set()
            return
        colleague.send(msg.sender, "FYI: lunch at noon")  # arrives while the asker waits
        a, _, b = msg.body.partition("+")
        agent.send(msg.sender, str(int(a) + int(b)), reply_to=msg.id, type="response")

    stop = threading.Event()
    bus.serve({me: answer}, stop=stop, poll_s=0.2)


def main() -> None:
    url = os.environ.get("REDISBUS_URL")
    bus = Bus.from_url(url) if url else Bus.embedded()
    ready = threading.Event()
    t = threading.Thread(target=helper, args=(bus, ready), daemon=True)
    t.start()
    ready.wait(10)
    me = bus.channel(CHANNEL).join("asker")

    reply = me.ask("calculator", "2+3", timeout=10)  # a "request"; returns the reply
    print(f"asked 2+3, {reply.sender} answered {reply.body} (a reply to {reply.reply_to})")
    # the colleague's note arrived during ask() and was left unread for the next wait()
    news = me.wait(timeout=5).messages
    print(f"then wait() returned: {[m.body for m in news]}")
    me.mark_done([reply, *news])

    try:
        me.ask("colleague", "are you there?", timeout=0.5)  # nobody serves the colleague
    except AskTimeout as e:
        print(f"no answer from colleague: AskTimeout (request {e.request_id} stays in its inbox)")
    me.send("calculator", "stop")
    t.join(10)
    bus.close()


if __name__ == "__main__":
    main()
