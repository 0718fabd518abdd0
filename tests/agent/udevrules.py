"""A parser and a small evaluator for the subset of udev rule syntax devtag's rules use.

No udev can run in a container, and Debian 12's udevadm (systemd 252) has no
``verify`` verb, so the rules file is checked here instead:

* :func:`parse` tokenises every rule the way systemd's ``udev-rules.c`` does
  (``KEY[{attr}]OP"value"`` separated by commas, ``\\`` continuation lines,
  ``#`` comments) and rejects unknown keys, operators not allowed for a key,
  unknown ``IMPORT`` types and ``GOTO``s without a later ``LABEL``;
* :func:`run_event` evaluates the rules for one device event: ``==``/``!=``
  with globs and ``|`` (also on ``DEVPATH`` and ``ATTR{}``), ``TEST``, ``IMPORT{file}``, ``IMPORT{parent}``,
  ``ENV``/``TAG``/``SYMLINK`` assignment, ``GOTO``/``LABEL``, and the
  substitutions ``$attr{}``, ``$env{}``, ``$major``, ``$minor``, ``%n``, with
  the character replacement udev applies to ``SYMLINK`` values
  (``udev_replace_chars`` with ``"/ "`` allowed, white space in substituted
  values turned into ``_``).
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

MATCH_KEYS = {"ACTION", "DEVPATH", "KERNEL", "SUBSYSTEM", "DRIVER", "KERNELS", "SUBSYSTEMS", "DRIVERS", "TAGS",
              "RESULT", "TEST", "ATTRS", "ATTR", "ENV", "CONST", "PROGRAM", "IMPORT"}  # fmt: skip
ASSIGN_KEYS = {"NAME", "SYMLINK", "OWNER", "GROUP", "MODE", "TAG", "ENV", "RUN", "LABEL", "GOTO", "OPTIONS",
               "ATTR", "SYSCTL", "SECLABEL"}  # fmt: skip
IMPORT_TYPES = {"program", "builtin", "file", "db", "cmdline", "parent"}
_TOKEN = re.compile(r'\s*([A-Z_]+)(?:\{([^}]*)\})?\s*(==|!=|\+=|-=|:=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


@dataclass
class Token:
    key: str
    attr: Optional[str]
    op: str
    value: str


@dataclass
class Rule:
    line: int
    tokens: List[Token]


class RuleSyntaxError(ValueError):
    pass


def parse(text: str) -> List[Rule]:
    rules: List[Rule] = []
    lines = text.split("\n")
    number = 0
    while number < len(lines):
        start = number + 1
        line = lines[number]
        number += 1
        while line.endswith("\\"):
            if number >= len(lines):
                raise RuleSyntaxError(f"line {start}: continuation at end of file")
            line = line[:-1] + lines[number]
            number += 1
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        tokens: List[Token] = []
        position = 0
        while position < len(line) and line[position:].strip():
            match = _TOKEN.match(line, position)
            if not match:
                raise RuleSyntaxError(f"line {start}: cannot parse at {line[position:]!r}")
            key, attr, op, value = match.groups()
            if key == "IMPORT" and op == "=":
                op = "=="  # udev: IMPORT{type}="x" is a match that imports as a side effect
            if key == "IMPORT" and op not in ("==", "!="):
                raise RuleSyntaxError(f"line {start}: IMPORT takes = or !=")
            if op in ("==", "!=") and key not in MATCH_KEYS:
                raise RuleSyntaxError(f"line {start}: {key} cannot be matched")
            if op not in ("==", "!=") and key not in ASSIGN_KEYS:
                raise RuleSyntaxError(f"line {start}: {key} cannot be assigned")
            if key in ("ENV", "ATTR", "ATTRS", "IMPORT", "SYSCTL", "SECLABEL") and not attr:
                raise RuleSyntaxError(f"line {start}: {key} needs {{...}}")
            if key == "IMPORT" and attr not in IMPORT_TYPES:
                raise RuleSyntaxError(f"line {start}: unknown IMPORT type {attr}")
            tokens.append(Token(key, attr, op, value.replace('\\"', '"')))
            position = match.end()
        rules.append(Rule(start, tokens))
    labels = [(i, t.value) for i, r in enumerate(rules) for t in r.tokens if t.key == "LABEL"]
    for index, rule in enumerate(rules):
        for token in rule.tokens:
            if token.key == "GOTO" and not any(i > index and name == token.value for i, name in labels):
                raise RuleSyntaxError(f"line {rule.line}: GOTO {token.value!r} has no later LABEL")
    return rules


@dataclass
class Event:
    """One uevent: the kernel's properties and the device's sysfs directory under ``root``."""

    root: str
    syspath: str
    env: Dict[str, str]
    parent_env: Dict[str, str] = field(default_factory=dict)
    links: List[str] = field(default_factory=list)
    tags: List[str] = field(default_factory=list)

    def attr(self, name: str) -> str:
        try:
            with open(os.path.join(self.root, self.syspath.lstrip("/"), name)) as handle:
                return handle.read().rstrip()
        except OSError:
            return ""


def _glob(pattern: str, value: str) -> bool:
    return any(fnmatch.fnmatchcase(value, alternative) for alternative in pattern.split("|"))


def _format(event: Event, template: str, replace_whitespace: bool) -> str:
    def substituted(value: str) -> str:
        return re.sub(r"\s", "_", value) if replace_whitespace else value

    def one(match: re.Match[str]) -> str:
        text = match.group(0)
        if text.startswith(("$attr{", "%s{")):
            return substituted(event.attr(match.group(1)))
        if text.startswith(("$env{", "%E{")):
            return substituted(event.env.get(match.group(2), ""))
        number = re.search(r"[0-9]*$", os.path.basename(event.syspath)).group(0)  # the kernel number
        table = {"$major": event.env.get("MAJOR", ""), "$minor": event.env.get("MINOR", ""), "%n": number}
        table.update({"%M": table["$major"], "%m": table["$minor"], "%%": "%", "$$": "$"})
        table.update({"$kernel": os.path.basename(event.syspath), "%k": os.path.basename(event.syspath)})
        return table[text]

    pattern = r"(?:\$attr|%s)\{([^}]*)\}|(?:\$env|%E)\{([^}]*)\}|\$major|\$minor|\$kernel|%M|%m|%n|%k|%%|\$\$"
    return re.sub(pattern, one, template)


def replace_chars(text: str, allow: str) -> str:
    """systemd's ``udev_replace_chars``."""
    out = []
    index = 0
    while index < len(text):
        char = text[index]
        if (char.isascii() and char.isalnum()) or char in "#+-.:=@_" or char in allow:
            out.append(char)
        elif char == "\\" and text[index + 1 : index + 2] == "x":
            out.append(text[index : index + 2])
            index += 1
        elif ord(char) > 0x7F:
            out.append(char)  # valid UTF-8 by construction of str
        elif char.isspace() and " " in allow:
            out.append(" ")
        else:
            out.append("_")
        index += 1
    return "".join(out)


def _import_file(event: Event, path: str) -> bool:
    try:
        with open(os.path.join(event.root, path.lstrip("/")), encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return False
    for raw in text.split("\n"):
        line = raw.lstrip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if value[:1] in ("'", '"') and len(value) > 1 and value[-1] == value[0]:
            value = value[1:-1]
        if key and value:
            event.env[key] = value
    return True


def run_event(rules: List[Rule], event: Event) -> Event:
    goto: Optional[str] = None
    for rule in rules:
        if goto is not None:
            if any(t.key == "LABEL" and t.value == goto for t in rule.tokens):
                goto = None
            continue
        for token in rule.tokens:
            if not _apply(event, token):
                break
            if token.key == "GOTO":
                goto = token.value
        # a rule with only a LABEL or nothing matching simply ends here
    return event


def _apply(event: Event, token: Token) -> bool:
    key, op = token.key, token.op
    if op in ("==", "!="):
        if key == "ACTION":
            result = _glob(token.value, event.env["ACTION"])
        elif key == "SUBSYSTEM":
            result = _glob(token.value, event.env["SUBSYSTEM"])
        elif key == "ENV":
            result = _glob(token.value, event.env.get(token.attr or "", ""))
        elif key == "DEVPATH":
            result = _glob(token.value, event.env["DEVPATH"])
        elif key == "ATTR":
            result = _glob(token.value, event.attr(token.attr or ""))
        elif key == "TEST":  # a relative path is relative to the device's sysfs directory
            path = _format(event, token.value, False)
            if not path.startswith("/"):
                path = f"{event.syspath}/{path}"
            result = os.path.exists(os.path.join(event.root, path.lstrip("/")))
        elif key == "IMPORT" and token.attr == "file":
            result = _import_file(event, _format(event, token.value, False))
        elif key == "IMPORT" and token.attr == "parent":
            names = [k for k in event.parent_env if fnmatch.fnmatchcase(k, token.value)]
            for name in names:
                event.env[name] = event.parent_env[name]
            result = bool(names)
        else:
            raise NotImplementedError(f"{key}{{{token.attr}}} {op}")
        return result if op == "==" else not result
    if key == "ENV":
        value = _format(event, token.value, False)
        if op == "+=" and event.env.get(token.attr or ""):
            value = event.env[token.attr or ""] + " " + value
        event.env[token.attr or ""] = value
    elif key == "TAG":
        event.tags.append(token.value)
    elif key == "SYMLINK":
        buf = replace_chars(_format(event, token.value, True), "/ ")
        event.links.extend("/dev/" + part for part in buf.split(" ") if part)
    elif key in ("GOTO", "LABEL"):
        pass
    else:
        raise NotImplementedError(f"{key} {op}")
    return True


def event_for(root: str, syspath: str, action: str = "change", parent_env: Optional[Dict[str, str]] = None) -> Event:
    """The kernel properties of a fake device (what its uevent would carry)."""
    path = os.path.join(root, syspath.lstrip("/"))
    env = {"ACTION": action, "DEVPATH": syspath[len("/sys") :]}
    name = os.path.basename(syspath)
    if os.path.basename(os.path.dirname(syspath)) == "net":
        env.update(SUBSYSTEM="net", INTERFACE=name)
    else:
        env["SUBSYSTEM"] = "block"
        with open(os.path.join(path, "dev")) as handle:
            env["MAJOR"], env["MINOR"] = handle.read().strip().split(":")
        env["DEVNAME"] = "/dev/" + name
        if os.path.exists(os.path.join(path, "partition")):
            with open(os.path.join(path, "partition")) as handle:
                env.update(DEVTYPE="partition", PARTN=handle.read().strip())
        else:
            env["DEVTYPE"] = "disk"
    return Event(root, syspath, env, parent_env=dict(parent_env or {}))


def links_of(rules: List[Rule], root: str, syspath: str) -> Tuple[Event, Dict[str, List[str]]]:
    """Run a change event on a disk and on each of its partitions; return the disk's event and links by name."""
    disk = run_event(rules, event_for(root, syspath))
    result = {os.path.basename(syspath): disk.links}
    for name in sorted(os.listdir(os.path.join(root, syspath.lstrip("/")))):
        if os.path.exists(os.path.join(root, syspath.lstrip("/"), name, "partition")):
            part = run_event(rules, event_for(root, f"{syspath}/{name}", parent_env=disk.env))
            result[name] = part.links
    return disk, result


def simulate_udev(rules: List[Rule], root: str) -> None:
    """Do what udevd would after ``udevadm trigger``: run every disk, partition and NIC through the
    rules, write ``/run/udev/data/<b|n>...`` (``E:`` properties) and make the ``SYMLINK``s."""
    base = os.path.join(root, "sys/class")
    for subsystem in ("block", "net"):
        for name in (
            sorted(os.listdir(os.path.join(base, subsystem))) if os.path.isdir(os.path.join(base, subsystem)) else []
        ):
            syspath = "/" + os.path.relpath(os.path.realpath(os.path.join(base, subsystem, name)), root)
            if subsystem == "block" and os.path.exists(os.path.join(root, syspath.lstrip("/"), "partition")):
                continue  # handled with its disk
            if subsystem == "block":
                disk, _ = links_of(rules, root, syspath)
                events = [disk]
                for part in sorted(os.listdir(os.path.join(root, syspath.lstrip("/")))):
                    if os.path.exists(os.path.join(root, syspath.lstrip("/"), part, "partition")):
                        events.append(run_event(rules, event_for(root, f"{syspath}/{part}", parent_env=disk.env)))
            else:
                events = [run_event(rules, event_for(root, syspath))]
            for event in events:
                if event.env["SUBSYSTEM"] == "net":
                    key = "n" + event.attr("ifindex")
                else:
                    key = f"b{event.env['MAJOR']}:{event.env['MINOR']}"
                data = os.path.join(root, "run/udev/data", key)
                os.makedirs(os.path.dirname(data), exist_ok=True)
                with open(data, "w", encoding="utf-8") as handle:
                    handle.write("".join(f"E:{k}={v}\n" for k, v in event.env.items() if k != "ACTION"))
                for link in event.links:
                    path = os.path.join(root, link.lstrip("/"))
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    if os.path.lexists(path):
                        os.unlink(path)
                    os.symlink(
                        os.path.relpath(os.path.join(root, event.env["DEVNAME"].lstrip("/")), os.path.dirname(path)),
                        path,
                    )
