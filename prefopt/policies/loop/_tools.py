"""Tools as plain Python functions: their schemas, the calls a completion makes, their results.

A tool is a function with type hints and a Google-style docstring, as
transformers' chat templates take them (:func:`transformers.utils.get_json_schema`
reads both); a completion calls it in the model's chat-template format
(:func:`parse_tool_calls`) and the loop runs it (:func:`run_tool`): whatever
goes wrong (an unknown name, bad arguments, an exception, a time-out, a result
that is not text) goes back to the model as text and is counted, never raised
out of a fit.
"""

from __future__ import annotations

import enum
import inspect
import json
import re
import threading
import typing
from dataclasses import dataclass

from transformers.utils import get_json_schema

# The Hermes / Qwen format of a tool call, which chat templates of Qwen2.5, Qwen3,
# Hermes and many more write and which a tokenizer with no response schema is read in:
# <tool_call>{"name": ..., "arguments": {...}}</tool_call>.
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
# A text-format tool result (no chat template): what follows the policy's turn.
TOOL_RESPONSE = "<tool_response>{}</tool_response>"


_BASIC = (int, float, str, bool, list, tuple, dict, type(None), typing.Any)


def _basic_hint(hint) -> bool:
    """Whether a type hint is one a JSON schema describes: basic types, Enum, Literal,
    and list, tuple, dict and unions of those (what transformers' ``get_json_schema``
    documents; some of its versions map any other class to ``"object"`` silently)."""
    origin = typing.get_origin(hint)
    if origin is None:
        return hint in _BASIC or (isinstance(hint, type) and issubclass(hint, enum.Enum))
    if origin is typing.Literal:
        return True
    return all(_basic_hint(arg) for arg in typing.get_args(hint) if arg is not Ellipsis)


def check_tools(tools, who: str) -> dict:
    """The tools by name, each with its JSON schema; refused before training when unusable.

    Parameters
    ----------
    tools : list of callables or None
    who : str
        The estimator, for messages.

    Returns
    -------
    tools : dict of str to (callable, dict)
        Each tool's function and schema, by the function's name.

    Examples
    --------
    >>> def add(a: int, b: int) -> str:
    ...     '''Add two integers.
    ...
    ...     Args:
    ...         a: The first.
    ...         b: The second.
    ...     '''
    ...     return str(a + b)
    >>> check_tools([add], "GRPOPolicy")["add"][1]["function"]["parameters"]["required"]
    ['a', 'b']
    """
    if tools is None:
        return {}
    if callable(tools) or isinstance(tools, (str, bytes, dict)):
        raise TypeError(f"{who}: tools must be a list of functions; got {type(tools).__name__}.")
    out: dict = {}
    for i, tool in enumerate(tools):
        if not callable(tool):
            raise TypeError(
                f"{who}: tools[{i}] is a {type(tool).__name__}, not a function; each tool is a "
                "plain Python function with type hints and a docstring."
            )
        name = getattr(tool, "__name__", type(tool).__name__)
        try:
            hints = typing.get_type_hints(tool)
            hints.pop("return", None)
            odd = [arg for arg, hint in hints.items() if not _basic_hint(hint)]
            if odd:
                raise TypeError(f"the type hint of {', '.join(odd)} is not a basic type")
            schema = get_json_schema(tool)
        except Exception as error:  # noqa: BLE001 - transformers' own parsing exceptions
            raise ValueError(
                f"{who}: the tool {name!r} cannot be described to the model ({error}). A tool "
                "needs a Google-style docstring (a description, then an 'Args:' section with "
                "one line per argument) and type hints of basic types (int, float, str, bool, "
                "list, dict, Literal)."
            ) from None
        if name in out:
            raise ValueError(f"{who}: two tools are named {name!r}; tool names must differ.")
        out[name] = (tool, schema)
    return out


def parse_tool_calls(text: str, tokenizer=None) -> list:
    """The tool calls in a completion, in the model's chat-template format.

    A tokenizer with a ``response_schema`` parses with it
    (``tokenizer.parse_response``, transformers' own reader of a chat model's
    output); otherwise the Hermes format ``<tool_call>{"name": ..., "arguments":
    {...}}</tool_call>`` that Qwen and Hermes chat templates write.

    Parameters
    ----------
    text : str
        The completion of one turn.
    tokenizer : transformers tokenizer, default=None

    Returns
    -------
    calls : list of (str or None, dict or str)
        Each call's name and arguments; a call that cannot be read is
        ``(None, message)``, an error returned to the model.

    Examples
    --------
    >>> parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>')
    [('add', {'a': 1, 'b': 2})]
    >>> parse_tool_calls("<tool_call>add(1, 2)</tool_call>")[0][0] is None
    True
    """
    if tokenizer is not None and getattr(tokenizer, "response_schema", None):
        try:
            parsed = tokenizer.parse_response(text)
        except Exception as error:  # noqa: BLE001 - the schema's own errors
            return [(None, f"Error: the tool call could not be read ({error}).")]
        calls = parsed.get("tool_calls") or [] if isinstance(parsed, dict) else []
        return [_read_call(call.get("function", call)) for call in calls]
    out = []
    for body in _TOOL_CALL.findall(text):
        try:
            call = json.loads(body)
        except json.JSONDecodeError as error:
            out.append((None, f"Error: the tool call is not valid JSON ({error.msg})."))
            continue
        out.append(_read_call(call))
    return out


def _read_call(call) -> tuple:
    """``(name, arguments)`` of one parsed call, or ``(None, message)``."""
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None, 'Error: a tool call is {"name": ..., "arguments": {...}}.'
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some templates write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None, f"Error: the arguments of {call['name']} are not valid JSON."
    if not isinstance(arguments, dict):
        return None, f"Error: the arguments of {call['name']} must be an object."
    return call["name"], arguments


@dataclass
class ToolResult:
    """What one call gave the model, and how it went.

    Parameters
    ----------
    name : str or None
        The tool called (``None`` when the call could not be read).
    content : str
        The text returned to the model.
    status : {"ok", "error", "timeout", "non_string"}
    """

    name: str | None
    content: str
    status: str


def run_tool(tools: dict, name, arguments, timeout: float) -> ToolResult:
    """Call one tool with a time limit; every failure becomes text for the model.

    Parameters
    ----------
    tools : dict
        :func:`check_tools`' answer.
    name : str or None
        The tool, or ``None`` for a call that could not be read (``arguments``
        is then its message).
    arguments : dict or str
    timeout : float
        Seconds a call may take; a call past it is abandoned (its thread is
        left to finish in the background) and reported as a time-out.

    Returns
    -------
    result : ToolResult

    Examples
    --------
    >>> def add(a: int, b: int) -> str:
    ...     '''Add.
    ...
    ...     Args:
    ...         a: The first.
    ...         b: The second.
    ...     '''
    ...     return str(a + b)
    >>> tools = check_tools([add], "doc")
    >>> run_tool(tools, "add", {"a": 2, "b": 3}, 1.0)
    ToolResult(name='add', content='5', status='ok')
    >>> run_tool(tools, "add", {"a": 2}, 1.0).status
    'error'
    """
    if name is None:
        return ToolResult(None, str(arguments), "error")
    if name not in tools:
        known = ", ".join(sorted(tools)) or "none"
        return ToolResult(name, f"Error: no tool named {name!r} (tools: {known}).", "error")
    function = tools[name][0]
    try:
        inspect.signature(function).bind(**arguments)
    except TypeError as error:
        return ToolResult(name, f"Error: {name} cannot take these arguments ({error}).", "error")
    box: dict = {}

    def call():
        try:
            box["value"] = function(**arguments)
        except Exception as error:  # noqa: BLE001 - a tool's failure is the model's to read
            box["error"] = f"Error: {name} raised {type(error).__name__}: {error}"

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return ToolResult(name, f"Error: {name} did not answer within {timeout:g} s.", "timeout")
    if "error" in box:
        return ToolResult(name, box["error"], "error")
    value = box.get("value")
    if isinstance(value, str):
        return ToolResult(name, value, "ok")
    # A result that is not text is shown as text (JSON where it can be) and counted: a
    # tool should return what the model reads.
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = str(value)
    return ToolResult(name, text, "non_string")
