"""Every Python example in the README, docs/ and the packages' docstrings names
real functions with parameters they accept.

The examples talk to libvirt hosts, databases and guests that do not exist
here, so they are not run: each is parsed, its imports are really imported,
and every call of a documented function or method (of a variable the example
built from a documented class) is bound against the real signature.  A
renamed function, parameter or keyword (``model=`` for ``model_name=``)
fails here instead of with a TypeError in a user's hands.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

import devtag_agent
import devtag_host

REPO = Path(__file__).resolve().parent.parent
MARKDOWN = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "packaging" / "README.md"]


def _markdown_examples() -> Iterator[Tuple[str, str]]:
    for path in MARKDOWN:
        text = path.read_text(encoding="utf-8")
        for number, block in enumerate(re.findall(r"```python\n(.*?)```", text, re.DOTALL)):
            yield f"{path.relative_to(REPO)}#{number}", block


def _docstring_blocks(doc: str) -> Iterator[str]:
    """The indented blocks after a line ending in ``::`` (reStructuredText literal blocks)."""
    lines = doc.splitlines()
    for index, line in enumerate(lines):
        if not line.rstrip().endswith("::"):
            continue
        block: List[str] = []
        for following in lines[index + 1 :]:
            if following.strip() and not following.startswith(" "):
                break
            block.append(following)
        text = inspect.cleandoc("\n".join(block))
        if re.search(r"^(from \S+ )?import ", text, re.MULTILINE) or "xample" in line:  # not file trees
            yield text


def _docstring_examples() -> Iterator[Tuple[str, str]]:
    for package in (devtag_host, devtag_agent):
        names = [package.__name__]
        modules = pkgutil.walk_packages(package.__path__, package.__name__ + ".")
        names += [m.name for m in modules if ".migrations" not in m.name]  # Alembic scripts run on import
        for name in names:
            try:
                module = importlib.import_module(name)
            except ImportError:  # optional backends; the import tests cover them
                continue
            for number, block in enumerate(_docstring_blocks(module.__doc__ or "")):
                yield f"{name}#{number}", block


EXAMPLES = sorted({*_markdown_examples(), *_docstring_examples()})


def _imports(tree: ast.Module) -> Dict[str, Any]:
    namespace: Dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            exec(compile(ast.Module(body=[node], type_ignores=[]), "<example>", "exec"), namespace)  # noqa: S102
    return namespace


def _resolve(node: ast.expr, namespace: Dict[str, Any], types: Dict[str, type]) -> Tuple[Optional[Any], bool]:
    """(callable, is_unbound_method) for a call target the example's names determine, else (None, False)."""
    if isinstance(node, ast.Name):
        return namespace.get(node.id), False
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        owner = node.value.id
        if owner in types:
            return getattr(types[owner], node.attr), True  # AttributeError: the method is gone
        if inspect.ismodule(namespace.get(owner)):
            return getattr(namespace[owner], node.attr), False
    return None, False


def _check(source: str) -> List[str]:
    tree = ast.parse(source)
    namespace = _imports(tree)
    types: Dict[str, type] = {}
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and len(node.targets) == 1:
            target, (built, _) = node.targets[0], _resolve(node.value.func, namespace, types)
            if isinstance(target, ast.Name) and inspect.isclass(built):
                types[target.id] = built
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        function, unbound = _resolve(node.func, namespace, types)
        if function is None or not callable(function):
            continue
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            continue
        try:
            signature = inspect.signature(function)
        except (TypeError, ValueError):  # builtins without a signature
            continue
        arguments = [None] * (len(node.args) + (1 if unbound else 0))
        try:
            signature.bind(*arguments, **{k.arg: None for k in node.keywords})
        except TypeError as exc:
            problems.append(f"line {node.lineno}: {ast.unparse(node.func)}(...): {exc}")
    return problems


def test_the_examples_are_found() -> None:
    names = {name.split("#")[0] for name, _ in EXAMPLES}
    assert {"README.md", "docs/attach.md", "devtag_host.attach", "devtag_host.configdrive"} <= names


@pytest.mark.parametrize(("where", "source"), EXAMPLES, ids=[name for name, _ in EXAMPLES])
def test_documented_example_calls_match_the_api(where: str, source: str) -> None:
    assert _check(source) == []


def test_the_checker_catches_a_wrong_keyword() -> None:
    example = """
from devtag_host import virt
from devtag_host.attach import AttachmentStore, ComputeHost
host = ComputeHost(virt.open_connection(), AttachmentStore())
host.attach_interface("web1", network="isolated", model="e1000")
"""
    [problem] = _check(example)
    assert "attach_interface" in problem and "model" in problem


def test_the_attach_api_summary_names_real_keywords() -> None:
    """``devtag_host.attach``'s prose API list (``method(a, b=, c=)``) against the classes."""
    from devtag_host import attach

    classes = [attach.ComputeHost, attach.AttachmentStore]
    checked = 0
    for name, parameters in re.findall(r"``(\w+)\(([^`]*)\)", attach.__doc__ or ""):
        owners = [cls for cls in classes if hasattr(cls, name)]
        if not owners:
            continue
        signature = inspect.signature(getattr(owners[0], name))
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()):
            continue
        accepted = set(signature.parameters)
        for keyword in re.findall(r"(\w+)=", parameters):
            assert keyword in accepted, f"{name}: documented {keyword}=, accepts {sorted(accepted)}"
            checked += 1
    assert checked > 10
