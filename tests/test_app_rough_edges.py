"""What a new user hit in the app (issue 24), each checked headless on the fake engine: toasts
that cover the message box or eat "[...]", the status bar cut mid-word at 80 columns, F1 cut at
160, the tab title after a reset, the palette's Screenshot, and a restored chat's first reply
that looked hung while its history was read again."""

from __future__ import annotations

from pathlib import Path

from app_doubles import FakeEngine, async_test, fake_app, paste_text, wait_until
from rich.cells import cell_len
from textual.geometry import Region
from textual.widget import Widget
from textual.widgets import Footer, Static
from textual.widgets._footer import FooterKey
from textual.widgets._toast import Toast

from chat_app.history import HistoryStore
from chat_app.session import ChatSession, ChatSettings
from chat_app.widgets.status_bar import Field, Group, StatusBar, fit_groups


def rendered(widget: Widget) -> str:
    """The widget's text as the terminal shows it, a line per row."""
    lines = widget.render_lines(Region(0, 0, *widget.region.size))
    return "\n".join(line.text.rstrip() for line in lines)


async def ready(pilot) -> None:
    await wait_until(pilot, lambda: pilot.app.client.ready, "the engine")


async def send(pilot, text: str) -> None:
    await paste_text(pilot, text)
    await pilot.press("enter")


async def answered(pilot) -> None:
    pane = pilot.app.chat_screen.active_pane
    await wait_until(pilot, lambda: len(pane.session.messages) >= 2 and not pane.replying, "reply")


def test_a_line_too_narrow_leaves_out_whole_fields_least_important_first() -> None:
    model = Group((Field("model", 0), Field("cpu", 3)))
    tab = Group((Field("TTFT 50 ms", 2), Field("20.0 tok/s", 1)), "tab: ")
    assert fit_groups([model, tab], 41) == ["model · cpu", "tab: TTFT 50 ms · 20.0 tok/s"]
    assert fit_groups([model, tab], 40) == ["model", "tab: TTFT 50 ms · 20.0 tok/s"]
    assert fit_groups([model, tab], 30) == ["model", "tab: 20.0 tok/s"]
    assert fit_groups([model, tab], 20) == ["model", ""]
    assert fit_groups([model, tab], 3) == ["mo…", ""]  # the one field is cut, and only then


@async_test
async def test_the_status_bar_drops_whole_fields_at_80_columns(tmp_path: Path) -> None:
    app, _ = fake_app(tmp_path, FakeEngine(model_name="SmolLM2-135M-Instruct", step_time=0.05))
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await send(pilot, "hello there")
        await answered(pilot)
        app.chat_screen.refresh_status()
        await pilot.pause()
        bar = app.chat_screen.query_one(StatusBar)
        shown = [s for s in bar.query(Static) if s.display]
        assert {s.id for s in shown} >= {"status-model", "status-tab", "status-rate"}
        for static in shown:  # every field whole, every widget inside the bar
            text = str(static.content)
            assert cell_len(text) <= static.region.width, static.id
            assert static.region.right <= bar.content_region.right, static.id
        assert str(bar.query_one("#status-rate", Static).content).endswith(" tok/s")
        assert str(bar.query_one("#status-tab", Static).content).endswith(" tok/s")


@async_test
async def test_toasts_stay_clear_of_the_input_and_keep_brackets(tmp_path: Path) -> None:
    notice = "The history /x/history.db is read-only ([Errno 30] Read-only file system)."
    app, _ = fake_app(tmp_path, notices=[notice])
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await ready(pilot)
        await send(pilot, "export me")
        await answered(pilot)
        await pilot.press("ctrl+e")
        await wait_until(pilot, lambda: len(app.screen.query(Toast)) == 2, "two toasts")
        await pilot.pause()
        path = next((tmp_path / "exports").iterdir())
        box = app.chat_screen.active_pane.input.region
        bar = app.chat_screen.query_one(StatusBar).region
        texts = []
        for toast in app.screen.query(Toast):
            assert not toast.region.overlaps(box) and not toast.region.overlaps(bar)
            lines = [line.lstrip("▌ ") for line in rendered(toast).splitlines()]
            texts.append("".join(lines))  # a path folded at the edge reads whole again
        assert any("([Errno 30] Read-only file" in text for text in texts)
        assert any(f"Chat exported to{path}" in text for text in texts)


@async_test
async def test_f1_help_shows_every_row_whole_at_160_and_80_columns(tmp_path: Path) -> None:
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=(160, 50)) as pilot:
        await ready(pilot)
        for size in ((160, 50), (80, 24)):
            await pilot.resize_terminal(*size)
            await pilot.press("f1")
            await pilot.pause()
            dialog = app.screen.query_one("#help-dialog")
            assert dialog.max_scroll_x == 0  # nothing hides to the right
            text = rendered(app.screen.query_one("#help-table"))
            for _, _, binding_id in app.chat_screen.shortcuts():
                assert binding_id in text, (size, binding_id)
            await pilot.press("escape")


@async_test
async def test_reset_renames_the_tab_and_undo_brings_the_title_back(tmp_path: Path) -> None:
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        screen = app.chat_screen
        pane = screen.active_pane

        def label() -> str:
            return str(screen.tabs.get_tab(pane).label)

        await send(pilot, "first topic")
        await answered(pilot)
        assert label() == "1 first topic"
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: label() == "1 New chat", "the tab renamed")
        await pilot.resize_terminal(80, 24)  # the footer, Undo reset included, still whole
        await pilot.pause()
        footer = screen.query_one(Footer)
        keys = list(footer.query(FooterKey))
        assert "Undo reset" in [k.description for k in keys]
        assert all(k.region.right <= footer.region.right for k in keys)
        await pilot.press("ctrl+z")
        await wait_until(pilot, lambda: label() == "1 first topic", "the title back")
        await pilot.press("ctrl+r")
        await send(pilot, "second topic")
        await answered(pilot)
        assert label() == "1 second topic"
    store = HistoryStore.open(tmp_path / "history.db")
    assert [s.title for s in store.list_sessions()] == ["second topic"]


@async_test
async def test_the_palettes_screenshot_saves_in_the_home_and_names_the_file(
    tmp_path: Path,
) -> None:
    app, _ = fake_app(tmp_path, screenshot_dir=tmp_path / "shots")
    notes: list[tuple[str, str]] = []
    app.notify = lambda message, **options: notes.append(  # type: ignore[method-assign]
        (message, options.get("severity", "information"))
    )
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        (command,) = [c for c in app.get_system_commands(app.screen) if c.title == "Screenshot"]
        command.callback()
        await wait_until(pilot, lambda: bool(notes), "the screenshot's toast")
    (saved,) = (tmp_path / "shots").iterdir()
    assert saved.suffix == ".svg" and "<svg" in saved.read_text()
    assert notes == [(f"Screen saved to {saved}", "information")]


def _restored_chat(folder: Path) -> ChatSession:
    """A chat with one answered question, saved and left open, as a restart finds it."""
    store = HistoryStore.open(folder / "history.db")
    session = ChatSession(ChatSettings(), store)
    session.add_user("an earlier question")
    session.begin_reply()
    session.extend_reply("an earlier answer")
    session.finish_reply("stop")
    store.set_open_tabs([session.id])
    store.close()
    return session


@async_test
async def test_a_restored_chat_says_it_is_re_reading_until_the_first_token(tmp_path: Path) -> None:
    _restored_chat(tmp_path)
    app, engine = fake_app(tmp_path, manual=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        tab = app.chat_screen.query_one(StatusBar).query_one("#status-tab", Static)
        await send(pilot, "and now?")
        pane = app.chat_screen.active_pane
        await wait_until(pilot, lambda: "re-reading" in str(tab.content), "the line")
        prompt = app.client.thread.engine.requests[-1][1]
        assert str(tab.content) == f"this tab: re-reading the chat: {len(prompt):,} tokens…"
        engine.allow_steps(1)  # the first token
        await wait_until(pilot, lambda: "re-reading" not in str(tab.content), "the line gone")
        engine.allow_steps(100)
        await wait_until(pilot, lambda: not pane.replying, "the reply")
        engine.hold()
        await send(pilot, "and then?")  # the engine holds this chat now: nothing to re-read
        await wait_until(pilot, lambda: pane.replying, "the second request")
        assert "re-reading" not in str(tab.content)
        assert app.client.rereading(pane) is None


@async_test
async def test_a_new_chat_never_says_re_reading(tmp_path: Path) -> None:
    app, engine = fake_app(tmp_path, manual=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await send(pilot, "a first question")
        pane = app.chat_screen.active_pane
        await wait_until(pilot, lambda: pane.replying, "the request")
        assert app.client.rereading(pane) is None
        engine.allow_steps(100)
