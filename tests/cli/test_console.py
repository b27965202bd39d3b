"""The console in a real browser: headless Chromium (Debian's ``chromium``) driven by
Playwright, against a real redis-server and a ``redisbus console`` process, with a scripted
conversation (a director, a writer and a designer; a reply thread; a dead letter).

Playwright only drives the browser installed on the machine; it never downloads one. Without
Chromium or Playwright these tests skip locally and fail in CI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from redisbus import Bus, BusSettings
from redisbus.embedded import free_port
from tests.support.servers import Server, missing

ROOT = Path(__file__).resolve().parents[2]
# the docs' screenshots are retaken only when asked (REDISBUS_DOC_SCREENSHOTS=1, e.g. before a
# release): a test run leaves the checkout as it found it
DOC_SHOTS = ROOT / "docs" / "img"


def shot_dir(tmp_path: Path) -> Path:
    return DOC_SHOTS if os.environ.get("REDISBUS_DOC_SCREENSHOTS") == "1" else tmp_path


TOKEN = "console-test-token"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
XSS = '<script>window.__owned = 1</script><img src=x onerror="window.__owned = 2"><b>bold?</b>'


@dataclass
class Film:
    """The scripted conversation on channel "film" and the handles that made it."""

    bus: Bus
    ch: Any
    director: Any
    writer: Any
    designer: Any
    kickoff: str  # director -> all
    draft: str  # writer -> director, a reply to the kickoff (read by the director, not done)
    notes: str  # director -> writer, a reply to the draft (still queued: unread)
    xss: str  # writer -> designer, a body and subject full of markup
    render: str  # director -> designer, delivered once and never finished: dead-lettered
    dead: str  # its dead letter's id


def film(url: str) -> Film:
    bus = Bus.from_url(url, settings=BusSettings(metrics=False, host="studio-1"))
    ch = bus.channel(
        "film",
        routing="family",
        siblings=True,
        pair_rate_burst=1000,
        pair_rate_per_s=1000,
        lease_s=0.1,
        max_deliveries=1,
    )
    director = ch.join("director")
    writer = ch.join("writer", parent="director")
    designer = ch.join("designer", parent="director")
    # a dead letter: delivered once, never finished, its lease ran out with no delivery left
    designer.send("director", "Storyboard sketches attached", subject="storyboard")
    render = director.send("designer", "Render all 12 frames at 8K", subject="render")
    assert [m.id for m in designer.wait(timeout=2).messages] == [render.id]
    time.sleep(0.15)
    assert ch.sweep().dead_lettered == 1
    ch.configure(lease_s=60, max_deliveries=5)
    (dead,) = ch.dead_letters()
    # a thread: the kickoff, the writer's draft in reply, the director's notes on the draft
    kickoff = director.send(
        "all", "Kick-off: neo-80s look, three scenes, due Friday.", subject="kickoff"
    )
    assert writer.wait(timeout=2).messages[0].id == kickoff[0].id
    writer.mark_done(kickoff[0].id)
    draft = writer.send(
        "director",
        "Script draft v1 ready:\nscene 1 - the arcade\nscene 2 - the rooftop",
        subject="kickoff",
        reply_to=kickoff[0].id,
    )
    assert draft.id in [m.id for m in director.wait(timeout=2).messages]
    notes = director.send("writer", "Good. Tighten scene 2.", subject="kickoff", reply_to=draft.id)
    xss = writer.send("designer", XSS, subject="<i>markup</i> in a subject")
    assert notes.id is not None and xss.id is not None and render.id is not None
    return Film(
        bus,
        ch,
        director,
        writer,
        designer,
        kickoff[0].id,
        draft.id,
        notes.id,
        xss.id,
        render.id,
        dead.id,
    )


@pytest.fixture
def conversation(redis_url: str) -> Iterator[Film]:
    f = film(redis_url)
    yield f
    f.bus.close()


@contextmanager
def console(url: str, *extra: str) -> Iterator[str]:
    """A ``redisbus console`` process on a free loopback port; yields its base URL."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDISBUS_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "redisbus.console", "--url", url, "--port", str(port), *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the console exited: {proc.stderr.read() if proc.stderr else ''}")
            try:
                if httpx.get(base + "/api/channels", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("the console did not answer within 30 s")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture(scope="module")
def read_only(redis7: Server) -> Iterator[str]:
    """A console without a token (one per module: each test flushes and scripts anew)."""
    with console(redis7.url) as base:
        yield base


@pytest.fixture(scope="module")
def with_token(redis7: Server) -> Iterator[str]:
    with console(redis7.url, "--token", TOKEN) as base:
        yield base


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not os.path.exists(chromium):
        missing("no chromium (Debian package `chromium`): apt-get install chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("playwright is not installed (pip install playwright)")
    pw = sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
    except Exception as e:
        pw.stop()
        missing(f"chromium did not start: {e}")
    yield b
    b.close()
    pw.stop()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    p = ctx.new_page()
    errors: list[str] = []
    p.on("pageerror", lambda e: errors.append(str(e)))
    p.set_default_timeout(15_000)
    yield p
    ctx.close()
    assert errors == [], errors


def message(page: Any, mid: str) -> Any:
    return page.locator(f'article.message[data-id="{mid}"]')


@pytest.mark.serial  # a live page in Chromium: beside a busy second worker its update came late
def test_the_page_shows_tree_thread_and_a_receipt_that_updates_live(
    conversation: Film, read_only: str, page: Any, tmp_path: Path
) -> None:
    f, base = conversation, read_only
    page.goto(f"{base}/c/film")
    # the family tree with statuses
    tree = page.locator("#tree li")
    tree.first.wait_for()
    assert tree.evaluate_all("els => els.map(e => [e.dataset.agent, e.dataset.status])") == [
        ["director", "running"],
        ["designer", "running"],
        ["writer", "running"],
    ]
    # the reply thread: kickoff, the draft replying to it, the notes replying to the draft
    thread = page.locator(f'section.thread[data-root="{f.kickoff}"] article.message')
    assert thread.evaluate_all("els => els.map(e => e.dataset.id)") == [
        f.kickoff,
        f.draft,
        f.notes,
    ]
    draft = message(page, f.draft)
    assert draft.locator(".from").text_content() == "writer"
    assert draft.locator("pre.body").text_content().startswith("Script draft v1 ready:\n")
    # unread (still queued for the writer) is highlighted; the read draft is not unread
    assert "unread" in (message(page, f.notes).get_attribute("class") or "")
    assert "unread" not in (draft.get_attribute("class") or "")
    row = draft.locator('.receipt[data-recipient="director"]')
    assert row.get_attribute("data-status") == "read"
    assert row.locator('[data-step="read"] .at').text_content()
    assert row.locator('[data-step="done"] .at').count() == 0

    # when the director marks the draft done, the timeline moves without a reload
    page.evaluate("window.__same_page = 42")
    f.director.mark_done(f.draft, result="approved")
    page.locator(
        f'article.message[data-id="{f.draft}"] .receipt[data-recipient="director"]'
        '[data-status="done"]'
    ).wait_for(timeout=10_000)
    assert page.evaluate("window.__same_page") == 42
    done = row.locator('[data-step="done"]')
    assert "on" in (done.get_attribute("class") or "")
    assert done.locator(".at").text_content()
    assert done.locator(".lat").text_content().startswith("+")
    assert "approved" in (row.locator(".result").text_content() or "")

    shots = shot_dir(tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shots / "console.png"), full_page=True)

    # the channel list links to the page
    page.goto(f"{base}/")
    row = page.locator('#channels tr[data-channel="film"]')
    assert row.locator("td").all_text_contents() == ["film", "3", "6", "1", "open"]
    page.set_viewport_size({"width": 900, "height": 260})
    page.screenshot(path=str(shots / "console-channels.png"))
    row.locator("a").click()
    page.wait_for_url(f"{base}/c/film")
    page.locator(f'article.message[data-id="{f.draft}"]').wait_for()


def test_with_the_token_replay_moves_the_dead_letter_back(
    conversation: Film, with_token: str, page: Any
) -> None:
    f, base = conversation, with_token
    page.goto(f"{base}/c/film")
    button = page.locator(f'li.dead-letter[data-id="{f.dead}"] button.replay')
    button.wait_for()
    assert button.is_disabled()  # visible, but locked until the token is given
    page.fill("#token", TOKEN)
    page.click("#unlock button")
    assert button.is_enabled()
    button.click()
    page.locator("#dead li").first.wait_for(state="detached", timeout=10_000)
    # the original stays in the stream, failed; the replay is a new message
    assert message(page, f.render).locator(".receipt").get_attribute("data-status") == "failed"
    replayed = page.locator(
        f'article.message:not([data-id="{f.render}"])', has_text="Render all 12 frames at 8K"
    )
    replayed.wait_for(timeout=10_000)
    assert replayed.locator(".receipt").get_attribute("data-recipient") == "designer"
    assert replayed.locator(".receipt").get_attribute("data-status") == "queued"
    assert f.ch.dead_letters() == []
    (entry_id, fields), *_ = f.bus.redis.xrevrange(f.ch.keys.stream, count=1)
    assert (fields["b"], fields["t"], fields["rp"]) == (
        "Render all 12 frames at 8K",
        "designer",
        f.dead,
    )


def test_read_only_console_hides_changes_and_refuses_them(
    conversation: Film, read_only: str, page: Any
) -> None:
    f, base = conversation, read_only
    page.goto(f"{base}/c/film")
    page.locator(f'li.dead-letter[data-id="{f.dead}"]').wait_for()
    assert page.locator("#mode").text_content() == "read-only"
    for hidden in ("button.replay", "#pause", "#resume", "#unlock"):
        assert not page.locator(hidden).is_visible(), hidden
    # the page's own requests are refused too, whatever they carry
    statuses = page.evaluate(
        """async (dead) => {
            const out = [];
            const paths = [`/api/replay?channel=film&id=${dead}`, "/api/pause?channel=film"];
            for (const path of paths) {
                const r = await fetch(path, {method: "POST",
                    headers: {Authorization: "Bearer anything-at-all"}});
                out.push([r.status, (await r.json()).error]);
            }
            return out;
        }""",
        f.dead,
    )
    assert statuses == [[403, "read_only"], [403, "read_only"]]
    assert [d.id for d in f.ch.dead_letters()] == [f.dead]
    assert f.ch.refresh().paused is False


def test_pause_and_resume_from_the_page_with_the_token(
    conversation: Film, with_token: str, page: Any
) -> None:
    f, base = conversation, with_token
    page.goto(f"{base}/c/film")
    page.fill("#token", TOKEN)
    page.click("#unlock button")
    page.click("#pause")
    page.locator("#paused").wait_for(state="visible", timeout=10_000)
    assert f.ch.refresh().paused is True
    page.click("#resume")
    page.locator("#paused").wait_for(state="hidden", timeout=10_000)
    assert f.ch.refresh().paused is False


def test_message_bodies_and_subjects_show_as_text_never_markup(
    conversation: Film, read_only: str, page: Any
) -> None:
    f, base = conversation, read_only
    page.goto(f"{base}/c/film")
    card = message(page, f.xss)
    card.wait_for()
    assert card.locator("pre.body").text_content() == XSS
    assert card.locator(".subject").text_content() == "<i>markup</i> in a subject"
    assert card.locator("img, script, b, i").count() == 0
    assert page.locator("main img, main script").count() == 0
    assert page.evaluate("typeof window.__owned") == "undefined"
