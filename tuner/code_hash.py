"""A kernel's version: a hash of the code it runs and of how it is searched (``code_version``).

What is hashed, for every kernel (built-ins and ``tuner.Kernel``/``tuner.autotune`` alike):

- device code: each launched ``@triton.jit`` function and every jit function it reaches,
  transitively (by name through its globals and closure, as a module attribute such as
  ``mod.helper``, and nested calls), and the module-level constants they read:
  ``tl.constexpr`` values and plain immutable ones (bool, int, float, str, None, tuples of
  them), by value. Triton's own functions (``tl.*``) are not: the Triton version is part of a
  config's identity already. This is the walk behind Triton's own cache key
  (``triton/runtime/jit.py``'s ``DependenciesFinder``), done here over the source with our
  own AST walk (no Triton internals, which differ from version to version);
- host code, where given (built-ins give their ``launch`` and ``default_config``): the Python
  functions, methods (``self.x``, ``super().x``) and classes they reach that are defined in
  the same top-level package, and the constants those read; anything of another package
  (``tuner``, ``torch``, the standard library) is not followed;
- the search: the space's parameters and values, and each constraint as host code.

Each function is hashed as its syntax tree, not its text: comments, docstrings and formatting
change nothing, and neither does an edit anywhere else in its module. A constant computed
from the environment (matmul's ``ROUND_TF32``: on for NVIDIA GPUs, off in the CPU
interpreter) is hashed with the value it has in this process, as Triton's cache key does:
processes that would run different code get different versions. Module-level lists and dicts
are not hashed (they may be caches that change while the process runs).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import textwrap
import tokenize
from collections.abc import Iterable, Iterator
from io import StringIO
from types import FunctionType, ModuleType
from typing import Any

from tuner.space import SearchSpace

_MISSING = object()
#: wrapper layers (autotuners, heuristics) unwrapped at most this deep
_MAX_LAYERS = 16


def code_version(*code: Any, space: SearchSpace | None = None, extra: Iterable[Any] = ()) -> str:
    """The 12-hex version of a kernel that runs ``code`` (jit functions, possibly under
    autotune/heuristics wrappers, and host functions or bound methods) searched over
    ``space``; ``extra``: anything else it depends on (values whose ``repr`` is stable)."""
    walk = _Walk()
    for obj in code:
        walk.entry(obj)
    if space is not None:
        walk.note("space", repr(space.describe()))
        for constraint in space.constraints:
            walk.entry(constraint)
    for value in extra:
        walk.note("extra", repr(value))
    digest = hashlib.sha256("\n".join(sorted(walk.items)).encode())
    return digest.hexdigest()[:12]


def jit_python(obj: Any) -> FunctionType | None:
    """The Python function of a Triton jit function (under any wrapper layers: autotuners,
    heuristics, ``tuner.autotune``); None for anything else."""
    layer = obj
    for _ in range(_MAX_LAYERS):
        try:
            fn = getattr(layer, "fn", None)
        except Exception:  # noqa: BLE001 - an object whose attributes fail is no kernel
            return None
        if isinstance(fn, FunctionType):
            return fn if _top(type(layer)) == "triton" else None
        if fn is None:
            return None
        layer = fn
    return None


def layers(obj: Any) -> Iterator[Any]:
    """``obj`` and the layers under it (``.fn``: autotuners, heuristics, ``tuner.autotune``),
    down to the jit function."""
    layer = obj
    for _ in range(_MAX_LAYERS):
        yield layer
        fn = getattr(layer, "fn", None)
        if fn is None or isinstance(fn, FunctionType):
            return
        layer = fn


def _top(obj: Any) -> str:
    """The top-level package an object (or a module) is defined in ('' when unknown)."""
    name = obj.__name__ if isinstance(obj, ModuleType) else getattr(obj, "__module__", None)
    return name.split(".")[0] if isinstance(name, str) else ""


def _constant(value: Any) -> str | None:
    """The stable text of an immutable constant (a ``tl.constexpr``'s value); None for
    anything else."""
    kind = type(value)
    if kind.__name__ == "constexpr" and _top(kind) == "triton":
        value = getattr(value, "value", None)
        kind = type(value)
    if value is None or kind in (bool, int, float, str, bytes):
        return repr(value)
    if kind in (tuple, frozenset):
        parts = [_constant(v) for v in value]
        texts = [p for p in parts if p is not None]
        if len(texts) < len(parts):
            return None
        return f"{kind.__name__}({','.join(sorted(texts) if kind is frozenset else texts)})"
    return None


# -- source as a syntax tree ---------------------------------------------------------------------

def _source(obj: Any) -> str | None:
    """The source of a function or class (a jit function's ``src`` where the file is gone)."""
    try:
        return textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError):
        return None


class _StripDocstrings(ast.NodeTransformer):
    """Drops every statement that is a bare string (docstrings, strings used as comments)."""

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for name in ("body", "orelse", "finalbody"):
            stmts = getattr(node, name, None)
            if isinstance(stmts, list):
                setattr(node, name, [s for s in stmts if not (
                    isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                    and isinstance(s.value.value, str))])
        return super().generic_visit(node)


def _dump(node: Any) -> str:
    """A node as text, fields that are None or empty left out (Python versions differ in
    which empty fields a node has), positions and string kinds ignored."""
    if isinstance(node, ast.AST):
        fields = [f"{name}={_dump(value)}" for name, value in ast.iter_fields(node)
                  if name not in ("kind", "type_comment") and value is not None and value != []]
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return f"[{','.join(_dump(v) for v in node)}]"
    return repr(node)


def _parsed(source: str) -> ast.Module | None:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    return _StripDocstrings().visit(tree)  # type: ignore[no-any-return]


def _tokens(source: str) -> str:
    """Source that does not parse alone (a lambda's line) as its tokens, comments dropped."""
    kept = []
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    try:
        for tok in tokenize.generate_tokens(StringIO(source).readline):
            if tok.type not in skip:
                kept.append(tok.string)
    except (tokenize.TokenError, SyntaxError):
        pass
    return " ".join(kept)


def _local_names(tree: ast.AST) -> set[str]:
    """Names bound inside the code (arguments, assignments, nested definitions, imports):
    they hide the module's globals of the same name."""
    names: set[str] = set()
    declared_global: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            declared_global.update(node.names)
    body = getattr(tree, "body", [])
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and (
                node not in body):
            names.add(node.name)  # nested definitions (the outer one is the module's)
    return names - declared_global


def _first_argument(tree: ast.Module) -> str | None:
    """The first parameter of the function ``tree`` defines (a method's ``self``/``cls``)."""
    node = tree.body[0] if tree.body else None
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = [*node.args.posonlyargs, *node.args.args]
        return args[0].arg if args else None
    return None


# -- the walk ----------------------------------------------------------------------------------

class _Walk:
    """The items a version hashes: one per function or class (its syntax tree) and one per
    constant read; each object once."""

    def __init__(self) -> None:
        self.items: set[str] = set()
        self._seen: set[tuple[int, int]] = set()
        self._alive: list[Any] = []  # keeps what was seen alive, so that no id is reused

    def note(self, kind: str, text: str) -> None:
        self.items.add(f"{kind}:{hashlib.sha256(text.encode()).hexdigest()}")

    def _first_visit(self, obj: Any, owner: Any = None) -> bool:
        key = (id(obj), id(owner))
        if key in self._seen:
            return False
        self._seen.add(key)
        self._alive.append((obj, owner))
        return True

    def entry(self, obj: Any) -> None:
        """A launched kernel or a host callable: its package is the one followed."""
        jit = jit_python(obj)
        if jit is not None:
            for layer in layers(obj):  # heuristics compute constexprs: their code counts
                values = getattr(layer, "values", None)
                if isinstance(values, dict):
                    for name, fn in sorted(values.items()):
                        self.note("heuristic", name)
                        self._host_value(fn, _top(fn))
            self._device(jit)
            return
        target, owner = obj, None
        if inspect.ismethod(obj):
            target, owner = obj.__func__, type(obj.__self__)
        elif isinstance(obj, functools.partial):
            self.note("partial", repr([_constant(v) for v in (*obj.args, *obj.keywords.values())]))
            target = obj.func
        elif not inspect.isroutine(obj) and not inspect.isclass(obj) and callable(obj):
            target, owner = type(obj).__call__, type(obj)  # a callable object
        target = inspect.unwrap(target) if callable(target) else target
        self._host_value(target, _top(target), owner)

    # device code

    def _device(self, fn: FunctionType) -> None:
        if _top(fn) == "triton" or not self._first_visit(fn):
            return
        source = _source(fn)
        tree = _parsed(source) if source is not None else None
        if tree is None:
            jit_src = source or ""
            self.note("jit", _tokens(jit_src) if jit_src else fn.__qualname__)
            return
        self.note("jit", _dump(tree))
        for name, value, _ in self._references(tree, fn, owner=None, host_package=None):
            jit = jit_python(value)
            if jit is not None:
                self._device(jit)
            elif (text := _constant(value)) is not None and name not in _unversioned(fn):
                self.note("const", f"{name}={text}")

    # host code

    def _host_value(self, value: Any, package: str, owner: Any = None) -> None:
        """Follow one value host code refers to: jit functions as device code, functions and
        classes of ``package`` as host code (``owner``: the class a method was found on, what
        its ``self`` is); nothing else."""
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        elif isinstance(value, property):
            value = value.fget
        if value is None:
            return
        jit = jit_python(value)
        if jit is not None:
            self._device(jit)
            return
        if callable(value) and not inspect.isclass(value):
            value = inspect.unwrap(value)
        if not (inspect.isfunction(value) or inspect.isclass(value)) or _top(value) != package:
            return
        if not self._first_visit(value, owner):
            return
        source = _source(value)
        tree = _parsed(source) if source is not None else None
        if tree is None:
            self.note("py", _tokens(source) if source else value.__qualname__)
            return
        self.note("py", _dump(tree))
        for name, found, found_owner in self._references(tree, value, owner, package):
            text = _constant(found)
            if text is not None and name not in _unversioned(value):
                self.note("const", f"{name}={text}")
            else:
                self._host_value(found, package, found_owner)

    # references

    def _references(self, tree: ast.Module, obj: Any, owner: Any,
                    host_package: str | None) -> Iterator[tuple[str, Any, Any]]:
        """(name, value, the class a method was looked up on) of every global the code reads:
        names through its globals and closure, and attribute chains (``mod.helper``; in host
        code also ``self.x``, ``super().x`` and attributes of the package's classes and their
        instances). Builtins are not globals."""
        namespace: dict[str, Any] = {}
        if inspect.isfunction(obj):
            namespace.update(obj.__globals__)
            for var, cell in zip(obj.__code__.co_freevars, obj.__closure__ or (), strict=False):
                try:
                    namespace[var] = cell.cell_contents
                except ValueError:  # an empty cell
                    continue
        elif inspect.isclass(obj):
            module = inspect.getmodule(obj)
            namespace.update(vars(module) if module is not None else {})
        local = _local_names(tree)
        this = _first_argument(tree) if owner is not None else None
        if this is not None:
            local.discard(this)
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                if node.id not in local and node.id != this and node.id in namespace:
                    yield node.id, namespace[node.id], None
            elif isinstance(node, ast.Attribute):
                found = self._attribute(node, namespace, local, this, obj, owner, host_package)
                if found is not None:
                    yield found

    def _attribute(self, node: ast.Attribute, namespace: dict[str, Any], local: set[str],
                   this: str | None, obj: Any, owner: Any,
                   host_package: str | None) -> tuple[str, Any, Any] | None:
        """(dotted name, value, class it was found on) of an attribute chain rooted at a
        global (or at a method's ``self``/``super()``), else None."""
        chain: list[str] = []
        root: ast.expr = node
        while isinstance(root, ast.Attribute):
            chain.append(root.attr)
            root = root.value
        chain.reverse()
        value: Any
        holder: Any = None
        if (isinstance(root, ast.Call) and isinstance(root.func, ast.Name)
                and root.func.id == "super" and owner is not None):
            value, holder = _super_attr(owner, obj, chain[0]), owner
            label, rest = f"super().{chain[0]}", chain[1:]
        elif isinstance(root, ast.Name) and this is not None and root.id == this:
            value, label, rest = owner, "self", chain
        elif isinstance(root, ast.Name) and root.id not in local and root.id in namespace:
            value, label, rest = namespace[root.id], root.id, chain
        else:
            return None
        for attr in rest:
            holder = value if inspect.isclass(value) else type(value)
            value = _step(value, attr, host_package)
            if value is _MISSING:
                return None
        if not isinstance(holder, type) or _top(holder) != host_package:
            holder = None
        return f"{label}.{'.'.join(rest)}" if rest else label, value, holder


def _unversioned(obj: Any) -> tuple[str, ...]:
    """The constants of ``obj``'s module that are settings of the machine a process runs on,
    not code (its ``__unversioned__``): e.g. matmul's ``ROUND_TF32``, off under the CPU
    interpreter, on on a GPU, so that a CPU-only service's API process (no
    ``TRITON_INTERPRET``) and its interpreter workers compute one version."""
    module = inspect.getmodule(obj)
    return tuple(getattr(module, "__unversioned__", ())) if module is not None else ()


def _step(value: Any, attr: str, host_package: str | None) -> Any:
    """One attribute: of a module (not Triton's; in host code only the package's modules), or
    in host code of a class or instance of the package (looked up statically: no property
    runs). _MISSING where the walk stops."""
    if isinstance(value, ModuleType):
        top = _top(value)
        if top == "triton" or (host_package is not None and top != host_package):
            return _MISSING
        return getattr(value, attr, _MISSING)
    if host_package is None:
        return _MISSING
    kind = value if inspect.isclass(value) else type(value)
    if _top(kind) != host_package:
        return _MISSING
    return inspect.getattr_static(value, attr, _MISSING)


def _super_attr(owner: type, method: Any, attr: str) -> Any:
    """``super().attr`` in ``method`` of ``owner``'s hierarchy: looked up after the class of
    ``owner``'s MRO that defines ``method``."""
    mro = owner.__mro__
    defining = next((i for i, cls in enumerate(mro) if any(
        inspect.unwrap(v) is method if callable(v) else False
        for v in vars(cls).values())), 0)
    for cls in mro[defining + 1:]:
        if attr in vars(cls):
            return vars(cls)[attr]
    return _MISSING
