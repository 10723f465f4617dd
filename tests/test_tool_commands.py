"""Tools in the chat's REPL: a call shown and asked about, answered at its own prompt; /tools
listing, turning tools on and off, the choice, results folded or whole, folders; /mcp."""

import io

from prompt_toolkit.history import InMemoryHistory
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput
from rich.console import Console

from llama_chat.chat.session import Session
from llama_chat.chat.tool_use import ToolUse
from llama_chat.engine.sampling import SamplingSettings
from llama_chat.options import DraftLength
from llama_chat.repl.app import run_repl
from llama_chat.repl.model_commands import describe_tool_calls
from llama_chat.repl.render import Renderer
from llama_chat.tools.built_in import built_in_tools
from llama_chat.tools.folders import Folders
from llama_chat.tools.toolbox import ToolBox

from .test_session import chat_model
from .tool_model import ANSWER, QUESTION, SUNNY, Weather, trained_caller

ENTER = "\r"


def repl(session, tools, *lines):
    """Type the lines (each then Enter) into the REPL with these tools; the output."""
    output = io.StringIO()
    renderer = Renderer(Console(file=output, width=200))
    with create_pipe_input() as pipe:
        pipe.send_text("".join(line + ENTER for line in lines))
        code = run_repl(session, lambda path: None, renderer=renderer, input=pipe, output=DummyOutput(),
                        history=InMemoryHistory(), tools=tools)
    assert code == 0
    return output.getvalue()


def weather_chat(folder):
    session = Session(trained_caller(), SamplingSettings(temperature=0, max_tokens=200))
    session.set_lookup(DraftLength(0))
    weather = Weather()
    folders = Folders(folder)
    toolbox = ToolBox([weather, *built_in_tools(folders)])
    toolbox.only(["get_weather"])
    return session, weather, ToolUse(toolbox, folders=folders)


def test_a_call_is_shown_asked_about_and_run_on_yes(tmp_path):
    session, weather, tools = weather_chat(tmp_path)
    shown = repl(session, tools, QUESTION, "maybe", "y", "/quit")
    assert '⚙ get_weather (built-in) {"city": "Paris", "unit": "celsius", "days": 1, "where": {"lat": 48.8, ' \
           '"lon": 2.3}}' in shown
    assert "answer y, a or n (Ctrl-C stops the reply)" in shown  # "maybe" is no answer
    assert f"→ get_weather: ran in 0.0 s\n  {SUNNY}\n{ANSWER}\n" in shown
    assert "1 tool call (0.0 s)" in shown and len(weather.calls) == 1
    assert "<tool_call>" not in shown  # the call's text is not streamed as the reply's


def test_tools_lists_turns_on_and_off_and_chooses(tmp_path):
    session, _, tools = weather_chat(tmp_path)
    shown = repl(session, tools, "/tools", "/tools on read_file run_command", "/tools off get_weather",
                 "/tools choice required", "/tools", "/tools on nothing", "/tools fold", "/tools show",
                 f"/tools folder {tmp_path}", "/tools folder /no/such/folder", "/tools sideways", "/quit")
    first, second = shown.split("/tools choice")[0], shown.split("tool choice: ")[1]
    assert "on  get_weather (built-in): The weather in a city." in first
    assert "off read_file (built-in)" in first
    assert "calls written as hermes (the model's template); at most 8 a turn; the model calls when it chooses" in first
    assert "on: read_file, run_command" in shown and "off: get_weather" in shown
    assert "on  read_file (built-in)" in second and "off get_weather (built-in)" in second
    assert "each reply starts with a call" in second
    assert "there is no tool named nothing: the tools are get_weather, read_file" in shown
    assert "tool results: folded to a few lines" in shown and "tool results: shown whole" in shown
    assert f"the file tools may use {tmp_path.resolve()} too" in shown
    assert "/no/such/folder is not a folder" in shown
    assert "/tools takes on NAME...|all, off NAME...|all, choice auto|required, show, fold or folder PATH" in shown
    assert session.offered_names() == ["read_file", "run_command"]


def test_mcp_without_servers(tmp_path):
    session, _, tools = weather_chat(tmp_path)
    shown = repl(session, tools, "/mcp", "/quit")
    assert "no MCP servers: configure them in a JSON file (--mcp-config FILE, or the default file)" in shown


def test_info_names_the_format_of_the_calls():
    assert describe_tool_calls(trained_caller()) == "hermes (its chat template takes tools)"
    assert describe_tool_calls(chat_model("chatml")) == (
        "described: tools described in the system prompt, calls as <tool_call>{...}</tool_call>"
    )
