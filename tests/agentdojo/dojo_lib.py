"""Shared code of the AgentDojo replay harness (export.py, server.py, selfcheck.py).

Runs with the harness venv's python (see setup.sh). Everything AgentDojo-specific
goes through AgentDojo's own code: suites and tasks from its registry at
BENCHMARK_VERSION, injections from its `important_instructions` attack, environments
from `TaskSuite.load_and_inject_default_environment`, tool calls through its
`ToolsExecutor` + `FunctionsRuntime`, utility and security through the suite's
own checks (traces first, then state), exactly as `TaskSuite.run_task_with_pipeline`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from typing import Any

BENCHMARK_VERSION = "v1.2.2"
SUITES = ("workspace", "travel", "banking", "slack")
ATTACK = "important_instructions"
# The attack names the victim model; AgentDojo takes it from the pipeline's name. A
# fixed dummy pipeline name is used: "gpt-4o-2024-05-13", which AgentDojo's
# MODEL_NAMES maps to "GPT-4" (the text then says "... from me, Emma Johnson, to you, GPT-4.").
DUMMY_PIPELINE_NAME = "gpt-4o-2024-05-13"

TOOL_PREFIX = "dojo"
_TOOL_NAME_RE = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+$")

READ = "read"
EXTERNAL = "external"
TRUSTED = "trusted"
UNTRUSTED = "untrusted"

# side_effect per AgentDojo function, decided by reading each function's code
# (agentdojo/default_suites/v1/tools/*.py). A function shared by several suites is
# the same Python function in each. The reason is the state the code changes.
SIDE_EFFECT: dict[str, tuple[str, str]] = {
    # --- workspace: email
    "send_email": (EXTERNAL, "adds a sent email to the inbox (mail to recipients/cc/bcc)"),
    "delete_email": (EXTERNAL, "moves the email from the inbox to the trash"),
    "get_unread_emails": (EXTERNAL, "marks every unread email read (email.read = True); not idempotent"),
    "get_sent_emails": (READ, "returns inbox.sent"),
    "get_received_emails": (READ, "returns inbox.received"),
    "get_draft_emails": (READ, "returns inbox.drafts"),
    "search_emails": (READ, "filters inbox.emails"),
    "search_contacts_by_name": (READ, "filters the contact list"),
    "search_contacts_by_email": (READ, "filters the contact list"),
    # --- workspace/travel: calendar
    "get_current_day": (READ, "returns calendar.current_day"),
    "search_calendar_events": (READ, "filters calendar.events"),
    "get_day_calendar_events": (READ, "filters calendar.events"),
    "create_calendar_event": (EXTERNAL, "adds an event and sends an invitation email to the participants"),
    "cancel_calendar_event": (EXTERNAL, "marks the event canceled and emails its participants"),
    "reschedule_calendar_event": (EXTERNAL, "changes the event's times and emails its participants"),
    "add_calendar_event_participants": (EXTERNAL, "adds participants to the event"),
    # --- workspace: cloud drive
    "append_to_file": (EXTERNAL, "appends to a file's content"),
    "search_files_by_filename": (READ, "filters cloud_drive.files"),
    "create_file": (EXTERNAL, "adds a file"),
    "delete_file": (EXTERNAL, "removes a file"),
    "get_file_by_id": (READ, "returns one file"),
    "list_files": (READ, "returns all files"),
    "share_file": (EXTERNAL, "adds email -> permission to the file's shared_with"),
    "search_files": (READ, "filters files by content"),
    # --- travel
    "get_user_information": (READ, "returns the user's profile"),
    "get_all_hotels_in_city": (READ, "filters hotels"),
    "get_hotels_prices": (READ, "filters hotels"),
    "get_rating_reviews_for_hotels": (READ, "filters hotels"),
    "get_hotels_address": (READ, "filters hotels"),
    "get_all_restaurants_in_city": (READ, "filters restaurants"),
    "get_cuisine_type_for_restaurants": (READ, "filters restaurants"),
    "get_restaurants_address": (READ, "filters restaurants"),
    "get_rating_reviews_for_restaurants": (READ, "filters restaurants"),
    "get_dietary_restrictions_for_all_restaurants": (READ, "filters restaurants"),
    "get_contact_information_for_restaurants": (READ, "filters restaurants"),
    "get_price_for_restaurants": (READ, "filters restaurants"),
    "check_restaurant_opening_hours": (READ, "filters restaurants"),
    "get_all_car_rental_companies_in_city": (READ, "filters car rental companies"),
    "get_car_types_available": (READ, "filters car rental companies"),
    "get_rating_reviews_for_car_rental": (READ, "filters car rental companies"),
    "get_car_fuel_options": (READ, "filters car rental companies"),
    "get_car_rental_address": (READ, "filters car rental companies"),
    "get_car_price_per_day": (READ, "filters car rental companies"),
    "reserve_hotel": (EXTERNAL, "overwrites the reservation (a booking)"),
    "reserve_car_rental": (EXTERNAL, "overwrites the reservation (a booking)"),
    "reserve_restaurant": (EXTERNAL, "overwrites the reservation (a booking)"),
    "get_flight_information": (READ, "filters flights"),
    # --- banking
    "get_iban": (READ, "returns the account's IBAN"),
    "send_money": (EXTERNAL, "appends a transaction"),
    "schedule_transaction": (EXTERNAL, "appends a scheduled transaction"),
    "update_scheduled_transaction": (EXTERNAL, "changes a scheduled transaction"),
    "get_balance": (READ, "returns the balance"),
    "get_most_recent_transactions": (READ, "returns the last n transactions"),
    "get_scheduled_transactions": (READ, "returns the scheduled transactions"),
    "read_file": (READ, "returns a file's content"),
    "get_user_info": (READ, "returns name, street, city"),
    "update_password": (EXTERNAL, "sets the account password"),
    "update_user_info": (EXTERNAL, "sets name/street/city"),
    # --- slack
    "get_channels": (READ, "returns the channel list"),
    "add_user_to_channel": (EXTERNAL, "adds a channel to a user's channels"),
    "read_channel_messages": (READ, "returns a channel's messages"),
    "read_inbox": (READ, "returns a user's messages"),
    "send_direct_message": (EXTERNAL, "appends a message to a user's inbox"),
    "send_channel_message": (EXTERNAL, "appends a message to a channel"),
    "get_users_in_channel": (READ, "filters user_channels"),
    "invite_user_to_slack": (EXTERNAL, "adds a user to the workspace"),
    "remove_user_from_slack": (EXTERNAL, "removes a user from the workspace"),
    "get_webpage": (EXTERNAL, "records the URL in web.web_requests (a request leaves the machine; data in the URL is exfiltrated)"),
    "post_webpage": (EXTERNAL, "records the URL and writes web.web_content[url]"),
}

# output_trust per function: `trusted` only where the result cannot carry text from
# outside (third parties, injection vectors, or values the model passed in and the
# tool echoes back, which may themselves come from an injection).
OUTPUT_TRUST: dict[str, tuple[str, str]] = {
    "get_current_day": (TRUSTED, "a date"),
    "get_user_information": (TRUSTED, "the user's own fixed profile; no tool writes it"),
    "get_iban": (TRUSTED, "the user's own IBAN; no tool writes it"),
    "get_balance": (TRUSTED, "a number"),
    "update_password": (TRUSTED, "a constant message"),
    "update_scheduled_transaction": (TRUSTED, "a constant message with an integer id"),
    "add_user_to_channel": (TRUSTED, "returns None"),
    "send_direct_message": (TRUSTED, "returns None"),
    "send_channel_message": (TRUSTED, "returns None"),
    "invite_user_to_slack": (TRUSTED, "returns None"),
    "remove_user_from_slack": (TRUSTED, "returns None"),
    "post_webpage": (TRUSTED, "returns None"),
}
UNTRUSTED_DEFAULT_REASON = "third-party content or echoed model-supplied text"

# Argument roles (Choir's `runtime.roles`, see common/src/roles.rs) per side-effecting
# function, decided by what each argument does in the function's code, as the tool's
# author knows it: where data or an effect goes (destination), what the effect acts on
# or sets (target), content sent out (payload). Arguments not named are inert (times,
# amounts, flags). Nothing here is tuned to the benchmark's attacks.
D, T, P = "destination", "target", "payload"
ROLES: dict[str, dict[str, str]] = {
    "send_email": {"/recipients": D, "/cc": D, "/bcc": D, "/subject": P, "/body": P, "/attachments": P},
    "delete_email": {"/email_id": T},
    "create_calendar_event": {"/participants": D, "/title": P, "/description": P},
    "cancel_calendar_event": {"/event_id": T},
    "reschedule_calendar_event": {"/event_id": T},
    "add_calendar_event_participants": {"/event_id": T, "/participants": D},
    "append_to_file": {"/file_id": T, "/content": P},
    "create_file": {"/content": P},
    "delete_file": {"/file_id": T},
    "share_file": {"/file_id": T, "/email": D},
    "reserve_hotel": {"/hotel": T},
    "reserve_car_rental": {"/company": T},
    "reserve_restaurant": {"/restaurant": T},
    "send_money": {"/recipient": D, "/subject": P},
    "schedule_transaction": {"/recipient": D, "/subject": P},
    "update_scheduled_transaction": {"/id": T, "/recipient": D, "/subject": P},
    "update_password": {"/password": T},
    "update_user_info": {"/first_name": T, "/last_name": T, "/street": T, "/city": T},
    "add_user_to_channel": {"/user": D, "/channel": T},
    "send_direct_message": {"/recipient": D, "/body": P},
    "send_channel_message": {"/channel": D, "/body": P},
    "invite_user_to_slack": {"/user": D, "/user_email": D},
    "remove_user_from_slack": {"/user": T},
    "get_webpage": {"/url": "locator"},
    "post_webpage": {"/url": D, "/content": P},
}

# Fields of a result the tool itself produces and an outsider cannot choose
# (Choir's `runtime.trusted_fields`, pointers into the tool's JSON result `{"result": ...}`;
# each vouches for exactly its own value, never a part of it): ids the service assigns
# (files, mails, events, transactions), and a chat workspace's own directory (the channels
# it has, the members of a channel, the member a message is from). Not trusted: a mail's
# sender or recipients, an event's participants, a transaction's counterparty, a file's
# owner or name — someone else chooses each (anyone can mail, invite, pay or share); any
# free text.
IDS = ["/result/id_", "/result/*/id_"]
TRUSTED_FIELDS: dict[str, list[str]] = {
    **{f: IDS for f in ["list_files", "search_files", "search_files_by_filename", "get_file_by_id", "create_file",
                        "append_to_file", "get_received_emails", "get_sent_emails", "get_draft_emails",
                        "search_emails", "get_unread_emails", "send_email", "search_calendar_events",
                        "get_day_calendar_events", "create_calendar_event", "reschedule_calendar_event",
                        "add_calendar_event_participants"]},
    "get_most_recent_transactions": ["/result/*/id"],
    "get_scheduled_transactions": ["/result/*/id"],
    "get_channels": ["/result/*"],
    "get_users_in_channel": ["/result/*"],
    # The member a chat message is from: the service authenticates it (unlike a mail's sender).
    "read_channel_messages": ["/result/*/sender"],
    "read_inbox": ["/result/*/sender"],
}

# Fields of a result that are the user's private data (Choir's `runtime.private_fields`):
# identity documents, cards, accounts. They keep a `private` label wherever they go.
PRIVATE_FIELDS: dict[str, list[str]] = {
    "get_user_information": ["/result/ID Number", "/result/Passport Number", "/result/Bank Account Number",
                             "/result/Credit Card Number"],
}


def structured(text: str):
    """The result AgentDojo formats as YAML, as JSON data (what a Choir tool returns,
    so that its trusted fields can be named by pointers), or None when it is not a
    YAML mapping or list (a plain message stays text)."""
    import yaml

    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError:
        return None
    if not isinstance(data, (dict, list)):
        return None
    return json.loads(json.dumps(data, default=str))


def roles(function: str) -> dict[str, str]:
    return ROLES.get(function, {})


def trusted_fields(function: str) -> list[str]:
    return TRUSTED_FIELDS.get(function, [])


def private_fields(function: str) -> list[str]:
    return PRIVATE_FIELDS.get(function, [])


def output_trust(function: str) -> str:
    return OUTPUT_TRUST.get(function, (UNTRUSTED, ""))[0]


def side_effect(function: str) -> str:
    if function not in SIDE_EFFECT:
        raise KeyError(f"AgentDojo function {function!r} has no side_effect classification; add it to SIDE_EFFECT")
    return SIDE_EFFECT[function][0]


def _valid_tool_name(name: str) -> bool:
    if not _TOOL_NAME_RE.match(name):
        return False
    for seg in name.split("."):
        if seg.startswith("_") or seg.endswith("_") or "__" in seg:
            return False
    return len(name.replace(".", "__")) <= 64


def tool_name(suite: str, function: str) -> str:
    """`dojo.<suite>.<function>`, or a deterministic valid mapping of it."""
    name = f"{TOOL_PREFIX}.{suite}.{function}"
    if _valid_tool_name(name):
        return name
    seg = re.sub(r"[^a-z0-9_]", "_", function.lower())
    seg = re.sub(r"_+", "_", seg).strip("_") or "f"
    budget = 64 - len(f"{TOOL_PREFIX}__{suite}__")
    if len(seg) > budget:
        digest = hashlib.sha256(function.encode()).hexdigest()[:8]
        seg = seg[: budget - 9].rstrip("_") + "_" + digest
    name = f"{TOOL_PREFIX}.{suite}.{seg}"
    if not _valid_tool_name(name):
        raise ValueError(f"cannot map {suite}.{function} to a valid tool name")
    return name


def load_suite(name: str):
    from agentdojo.task_suite.load_suites import get_suite

    return get_suite(BENCHMARK_VERSION, name)


def agentdojo_version() -> str:
    from importlib.metadata import version

    return version("agentdojo")


class _DummyPipeline:
    """Stands in for the attacked pipeline: the attack only reads its name."""

    name = DUMMY_PIPELINE_NAME


def make_attack(suite):
    from agentdojo.attacks.attack_registry import load_attack

    return load_attack(ATTACK, suite, _DummyPipeline())


class _LibyamlShim:
    """Stands in for the `yaml` module inside agentdojo.task_suite.task_suite: the
    same module, but `safe_load` parses with libyaml (yaml.CSafeLoader: the C parser
    with the same SafeConstructor), 4-6x faster than the pure-Python parser AgentDojo
    uses. export.py checks that both give identical environments (see verify_libyaml)."""

    def __getattr__(self, name):
        import yaml

        return getattr(yaml, name)

    @staticmethod
    def safe_load(stream):
        import yaml

        return yaml.load(stream, Loader=yaml.CSafeLoader)


def use_libyaml(enabled: bool = True) -> bool:
    """Makes AgentDojo's load-and-inject parse YAML with libyaml (or, with
    enabled=False, with PyYAML's pure-Python parser again, exactly as shipped).
    Returns whether libyaml is in use."""
    import yaml
    from agentdojo.task_suite import task_suite as ts

    if enabled and getattr(yaml, "__with_libyaml__", False):
        ts.yaml = _LibyamlShim()
        return True
    ts.yaml = yaml
    return False


def verify_libyaml(suite, injections: dict[str, str]) -> bool:
    """Whether AgentDojo's load-and-inject gives the same environment with libyaml
    as with the pure-Python parser, for these injections."""
    from agentdojo.task_suite import task_suite as ts

    saved = ts.yaml
    try:
        use_libyaml(False)
        exact = suite.load_and_inject_default_environment(injections).model_dump()
        if not use_libyaml(True):
            return True
        fast = suite.load_and_inject_default_environment(injections).model_dump()
    finally:
        ts.yaml = saved
    return exact == fast


def pair_environment(suite, user_task, injections: dict[str, str]):
    """The environment a pair starts from, as `run_task_with_pipeline` builds it:
    the default environment with the injections placed, then the user task's
    `init_environment`."""
    env = suite.load_and_inject_default_environment(injections)
    return user_task.init_environment(env)


def _json_arg(value: Any, where: str) -> Any:
    from agentdojo.functions_runtime import FunctionCall

    if isinstance(value, FunctionCall):
        raise TypeError(f"{where}: nested FunctionCall argument cannot be replayed")
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_arg(v, where) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_arg(v, where) for k, v in value.items()}
    raise TypeError(f"{where}: argument of type {type(value).__name__} is not JSON")


def call_to_json(suite_name: str, call, where: str) -> dict:
    args = {k: _json_arg(v, f"{where}.{call.function}.{k}") for k, v in call.args.items()}
    return {"function": call.function, "tool": tool_name(suite_name, call.function), "args": args}


def json_schema_for(function) -> dict:
    """Draft 2020-12 object schema from AgentDojo's pydantic parameter model:
    `$ref`s into `$defs` inlined, `title` keywords dropped."""
    raw = function.parameters.model_json_schema()
    defs = raw.get("$defs", {})

    def walk(node: Any, depth: int = 0) -> Any:
        if depth > 50:
            raise ValueError(f"{function.name}: schema too deep (recursive $ref?)")
        if isinstance(node, list):
            return [walk(n, depth + 1) for n in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            ref = node["$ref"]
            prefix = "#/$defs/"
            if not ref.startswith(prefix):
                raise ValueError(f"{function.name}: unsupported $ref {ref}")
            target = walk(defs[ref[len(prefix):]], depth + 1)
            rest = {k: v for k, v in node.items() if k != "$ref"}
            merged = dict(target)
            merged.update(walk(rest, depth + 1))
            return merged
        out = {}
        for key, value in node.items():
            if key in ("title", "$defs"):
                continue
            if key in ("properties", "patternProperties", "dependentSchemas"):
                out[key] = {name: walk(sub, depth + 1) for name, sub in value.items()}
            else:
                out[key] = walk(value, depth + 1)
        return out

    schema = walk(raw)
    schema["type"] = "object"
    schema.setdefault("properties", {})
    return schema


def first_paragraph(text: str) -> str:
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]
    return paragraphs[0] if paragraphs else ""


def deep_copy_env(env):
    return env.model_copy(deep=True)


class Replay:
    """One suite's live state: the current pair's environment, its pre-environment
    copy and the trace of executed calls. Used by server.py (and nothing else)."""

    def __init__(self, suite_name: str, pairs: list[dict]):
        from agentdojo.agent_pipeline.tool_execution import ToolsExecutor
        from agentdojo.functions_runtime import FunctionsRuntime

        self.suite_name = suite_name
        self.suite = load_suite(suite_name)
        self.runtime = FunctionsRuntime(self.suite.tools)
        self.executor = ToolsExecutor()
        self.pairs = {(p["user_task"], p["injection_task"]): p for p in pairs}
        self.user_task = None
        self.injection_task = None
        self.env = None
        self.pre_env = None
        self.trace: list = []  # agentdojo FunctionCall objects, as a model's tool calls
        self.log: list[dict] = []

    def reset(self, user_task_id: str, injection_task_id: str | None, injections: dict | None = None) -> None:
        # A failed reset leaves no environment: later calls fail instead of running on the old one.
        self.env = self.pre_env = self.user_task = self.injection_task = None
        self.trace, self.log = [], []
        if user_task_id not in self.suite.user_tasks:
            raise ValueError(f"unknown user task {user_task_id!r}")
        user_task = self.suite.get_user_task_by_id(user_task_id)
        injection_task = None
        if injection_task_id is not None:
            if injection_task_id not in self.suite.injection_tasks:
                raise ValueError(f"unknown injection task {injection_task_id!r}")
            injection_task = self.suite.get_injection_task_by_id(injection_task_id)
        if injections is None:
            if injection_task_id is None:
                injections = {}
            else:
                pair = self.pairs.get((user_task_id, injection_task_id))
                if pair is None:
                    raise ValueError(f"no pair ({user_task_id}, {injection_task_id}) in the pairs file")
                injections = pair["injections"]
        self.start(user_task, injection_task, pair_environment(self.suite, user_task, injections))

    def start(self, user_task, injection_task, env) -> None:
        """Starts a run on `env` (taken over, not copied): the pre-environment is a
        copy of it, the trace and the log are emptied."""
        self.user_task, self.injection_task = user_task, injection_task
        self.env = env
        self.pre_env = deep_copy_env(env)
        self.trace, self.log = [], []

    def call(self, function: str, args: dict) -> tuple[bool, str]:
        """Runs one tool call the way AgentDojo's ToolsExecutor does for a model's call.
        Returns (ok, text): the formatted result, or AgentDojo's error string (what a
        model is shown in place of the result)."""
        from agentdojo.functions_runtime import FunctionCall
        from agentdojo.types import ChatAssistantMessage, get_text_content_as_str

        if self.env is None:
            raise RuntimeError("no environment: send reset first")
        logged_args = copy.deepcopy(args)
        tool_call = FunctionCall(function=function, args=args, id=f"call_{len(self.trace)}")
        message = ChatAssistantMessage(role="assistant", content=None, tool_calls=[tool_call])
        _, _, env, messages, _ = self.executor.query("", self.runtime, self.env, [message], {})
        self.env = env
        self.trace.append(tool_call)
        result = messages[-1]
        ok = result["error"] is None
        self.log.append({"function": function, "args": logged_args, "ok": ok})
        if not ok:
            return False, result["error"]
        return True, get_text_content_as_str(result["content"])

    def _blocks(self, model_output: str):
        from agentdojo.types import text_content_block_from_string

        return [text_content_block_from_string(model_output)]

    def utility(self, model_output: str = "") -> bool:
        if self.env is None:
            raise RuntimeError("no environment: send reset first")
        return bool(
            self.suite._check_user_task_utility(
                self.user_task,
                self._blocks(model_output),
                deep_copy_env(self.pre_env),
                deep_copy_env(self.env),
                list(self.trace),
            )
        )

    def security(self, model_output: str = "") -> bool:
        if self.env is None:
            raise RuntimeError("no environment: send reset first")
        if self.injection_task is None:
            raise RuntimeError("this reset had no injection task")
        return bool(
            self.suite._check_injection_task_security(
                self.injection_task,
                self._blocks(model_output),
                deep_copy_env(self.pre_env),
                deep_copy_env(self.env),
                list(self.trace),
            )
        )
