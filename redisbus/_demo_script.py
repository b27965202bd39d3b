"""The scripted agents of the demo: an anime production team, one function per role.

Each role talks only through the public API of its own ``Agent`` handle: ``send``, ``wait``,
``read`` and ``mark_done``. Subjects are the protocol between the scripted roles (a real team
of LLM agents would read the bodies instead). Every wait has a deadline, so a broken run fails
with a clear line instead of hanging.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ._errors import RateLimited
from ._model import Message
from .bus import Agent

__all__ = ["CHILDREN", "ROLES", "Actor", "DemoError", "Stopped", "director"]

CHILDREN = ("writer", "designer", "storyboard")
Emit = Callable[..., None]
# An actor that can be stopped waits in slices this long: a wait holds its bus's connection
# (closing the bus waits for it), and the bus's own slice is 5 s.
STOP_CHECK_S = 0.25


class DemoError(Exception):
    """A scripted agent did not get what its script expects."""


class Stopped(DemoError):
    """The run is being stopped (Ctrl-C): the actor gives up where it is."""


SCRIPT_V1 = """NEON DREAMS, draft v1 (3 min)
SC1 EXT. NEO-TOKYO ROOFTOP, NIGHT. KAITO (17), a courier, watches drones swarm a megatower.
SC2 INT. ALLEY MARKET. Kaito trades a stolen memory chip to RIN (16), a hacker.
SC3 EXT. MEGATOWER. A chase through holograms; the chip wakes an AI, ECHO.
SC4 DAWN. Echo dissolves into the city grid; Kaito keeps one frame of her face."""

WARDROBE = (
    "Added wardrobe notes in v2: Kaito wears an oversized reflective courier jacket, taped "
    "gloves and one LED sneaker; Rin a cropped bomber over a mesh hoodie and a cracked AR "
    "visor; Echo has no clothes, only a silhouette of shifting signage."
)

NOTES = (
    "Let's go with neo-80s aesthetic: magenta and cyan neon, chrome, VHS grain, synth-pop "
    "pacing. Keep the runtime at 3 minutes."
)

SCRIPT_FINAL = """NEON DREAMS, final (v3, neo-80s pass)
SC1 Rooftop in magenta rain; drones draw cyan scanlines across the sky.
SC2 Alley market of CRT stalls; Kaito's chrome-trim jacket catches every sign.
SC3 Chase scored to one synth arpeggio; Echo speaks through billboards.
SC4 Sunrise in VHS grain; Kaito's visor replays Echo's last frame. 3:00."""

DESIGNS = (
    "Character designs (neo-80s): KAITO, chrome-trim courier jacket, cyan visor strip, one "
    "LED sneaker; RIN, magenta bomber, mesh hoodie, cracked AR visor with a scanline glow; "
    "ECHO, a shifting silhouette of billboard pixels, eyes as two VHS tracking bars."
)

PANELS = (
    "Panel 1 (SC1): wide shot, Kaito silhouetted on the rooftop, drones as cyan streaks.",
    "Panel 2 (SC2): close-up, the chip changing hands under a flickering CRT stall.",
    "Panel 3 (SC3): low angle, Kaito leaps between billboards, Echo's face in the pixels.",
    "Panel 4 (SC4): extreme close-up of Kaito's visor replaying Echo at sunrise.",
)

SIGN_OFF = {
    "writer": "Script final v3 locked: 4 scenes, 3:00.",
    "designer": "Three character sheets locked, neo-80s palette.",
    "storyboard": "Four panels posted; timing matches the final script.",
}


class Actor:
    """One scripted agent: its handle, its pace, and the messages it has not used yet."""

    def __init__(
        self,
        agent: Agent,
        pace: float,
        emit: Emit,
        timeout_s: float = 30.0,
        stop: threading.Event | None = None,
    ) -> None:
        self.agent = agent
        self.name = agent.name
        self.pace = pace
        self.emit = emit
        self.timeout_s = timeout_s
        self.stop = stop
        self.inbox: list[Message] = []

    def think(self, seconds: float, at_least: float = 0.0) -> None:
        """Work for a while, still fetching what arrives (so delivery is never held back)."""
        deadline = time.monotonic() + max(seconds * self.pace, at_least)
        while (left := deadline - time.monotonic()) > 0:
            self.fetch(left)

    def fetch(self, timeout: float) -> None:
        """Block in ``wait()`` for the next messages, and mark them done at once.

        Done as soon as they are in the actor's working memory (done on read:
        docs/concepts.md#lifecycle-and-receipts): the receipts then keep the moment of delivery, and
        the inbox counters stay at zero.
        """
        if self.stop is not None:
            if self.stop.is_set():
                raise Stopped(f"{self.name} stopped")
            timeout = min(timeout, STOP_CHECK_S)
        new = self.agent.wait(timeout=min(timeout, 300.0)).messages
        if new:
            self.agent.mark_done(new, result="ok")
            self.inbox += new

    def expect(self, subject: str, sender: str | None = None) -> Message:
        """The next message with this subject (prefix), waiting for it."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            for m in self.inbox:
                if m.subject.startswith(subject) and (sender is None or m.sender == sender):
                    self.inbox.remove(m)
                    return m
            left = deadline - time.monotonic()
            if left <= 0:
                raise DemoError(f"{self.name} waited {self.timeout_s:g} s for {subject!r}")
            self.fetch(left)

    def send(self, to: str | list[str], body: str, subject: str, **kw: Any) -> Any:
        """Send; on a rate-limit refusal, report it, wait the advised time, and send again."""
        for _attempt in range(5):
            try:
                return self.agent.send(to, body, subject=subject, **kw)
            except RateLimited as e:
                retry = e.retry_after_s or 0.5
                self.emit(
                    "refused",
                    agent=self.name,
                    to=to,
                    subject=subject,
                    code=e.code,
                    error=str(e),
                    limit=e.limit,
                    current=e.current,
                    retry_after_s=retry,
                )
                self.pause(retry)
        raise DemoError(f"{self.name} could not send {subject!r}")

    def pause(self, seconds: float) -> None:
        if self.stop is None:
            time.sleep(seconds)
        elif self.stop.wait(seconds):
            raise Stopped(f"{self.name} stopped")

    def finish(self) -> None:
        """Write the last read marks, and report."""
        self.agent.flush()
        self.emit("finished", agent=self.name)


# -- the roles ---------------------------------------------------------------------------------


def director(a: Actor, members_ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + a.timeout_s
    while not members_ready():  # the parent spawns its children, then briefs them
        if time.monotonic() > deadline:
            raise DemoError("the child agents did not join in time")
        a.pause(0.02)
    a.send(
        "all",
        "Start production on 'Neon Dreams', a 3-minute cyberpunk anime. Writer: the "
        "script. Designer: three main characters. Storyboard: panels once script and designs "
        "are final.",
        "kickoff",
        type="delegate_task",
    )
    a.expect("script v1")
    a.expect("script v2")
    a.think(0.5)
    a.send("all", NOTES, "notes", priority=1)
    a.expect("script final")
    a.expect("designs")
    for i in range(1, len(PANELS) + 1):
        a.expect(f"panel {i}")
    a.think(0.8, at_least=0.6)  # reviewing; also lets the storyboard's pair bucket refill
    review = a.send(
        "all",
        "Final review: confirm your deliverables are final and consistent with the neo-80s notes.",
        "final review",
        type="request",
    )
    for _ in CHILDREN:
        a.expect("sign-off")
    a.send(
        "all",
        "Deliverables accepted. Neon Dreams goes to animation. Thank you, team.",
        "wrap",
        type="status_update",
        reply_to=review[0].id,
    )
    a.finish()


def writer(a: Actor) -> None:
    a.expect("kickoff")
    a.think(0.8)
    a.send("all", SCRIPT_V1, "script v1")
    question = a.expect("question", sender="designer")
    a.think(0.6)
    a.send(["designer", "director"], WARDROBE, "script v2", type="response", reply_to=question.id)
    notes = a.expect("notes")
    a.think(0.6)
    a.send("all", SCRIPT_FINAL, "script final", reply_to=notes.id)
    _sign_off(a)


def designer(a: Actor) -> None:
    a.expect("kickoff")
    draft = a.expect("script v1")
    a.think(0.5)
    a.send(
        "writer",
        "Need descriptions of main character's outfit",
        "question",
        type="request",
        reply_to=draft.id,
    )
    a.expect("script v2")
    a.expect("notes")
    a.think(0.8)
    a.send(["director", "storyboard"], DESIGNS, "designs")
    _sign_off(a)


def storyboard(a: Actor) -> None:
    a.expect("kickoff")
    a.expect("script final")
    a.expect("designs")
    # Re-read the writer's whole thread from the board, addressed to it or not (open channel).
    thread = a.agent.read(filter_by="from:writer subject:script", limit=10)
    a.emit(
        "note",
        agent=a.name,
        text=f"read {len(thread)} messages with filter "
        f"'from:writer subject:script': {', '.join(m.subject for m in thread)}",
    )
    a.think(0.8)
    for i, panel in enumerate(PANELS, 1):  # eager: no pause between panels
        a.send("director", panel, f"panel {i}")
    _sign_off(a)


def _sign_off(a: Actor) -> None:
    review = a.expect("final review")
    a.send("director", SIGN_OFF[a.name], "sign-off", type="response", reply_to=review.id)
    a.expect("wrap")
    a.finish()


ROLES: dict[str, Callable[[Actor], None]] = {
    "writer": writer,
    "designer": designer,
    "storyboard": storyboard,
}
