"""gtrain's own module import graph has no cycle, and no file in gtrain/ is over 500 lines.

The graph is read with :mod:`ast`: every ``import`` / ``from ... import`` of a gtrain module, at the top of a
module and inside functions (a function-level import is still a dependency, only a later one). Imports under
``if TYPE_CHECKING:`` are checked separately: they never run, but a cycle there is still two modules that
each need the other; only the listed typing-only seams may have one."""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "gtrain"
MAX_LINES = 500

#: typing-only mutual references that are the seam itself (each names the other in annotations only)
TYPING_SEAMS = [
    # Provider.job_backend() hands out the default NodeScriptBackend(provider): the seam itself
    {"gtrain.jobs.backend", "gtrain.jobs.nodescript", "gtrain.providers.base"},
]


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


@lru_cache(maxsize=2)  # read once per run for each kind (every test here reads the same tree)
def import_graph(*, typing: bool) -> dict[str, set[str]]:
    """module -> the gtrain modules it imports (``from pkg import submodule`` is an edge to the submodule)."""
    mods = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]

        def visit(nodes: list[ast.stmt], mod: str = mod, pkg: str = pkg) -> None:
            for n in nodes:
                if isinstance(n, ast.If) and _is_type_checking(n.test):
                    if typing:
                        visit(n.body)
                    visit(n.orelse)
                    continue
                names: list[str] = []
                if isinstance(n, ast.Import):
                    names = [a.name for a in n.names]
                elif isinstance(n, ast.ImportFrom):
                    base = n.module or ""
                    if n.level:
                        up = pkg.split(".")[: len(pkg.split(".")) - (n.level - 1)]
                        base = ".".join(up + ([n.module] if n.module else []))
                    names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in n.names]
                for name in names:
                    target = resolve(name) if name.split(".")[0] == "gtrain" else None
                    if target and target != mod:
                        graph[mod].add(target)
                for field in ("body", "orelse", "finalbody", "handlers"):
                    sub = getattr(n, field, None)
                    if isinstance(sub, list):
                        visit(sub)

        visit(ast.parse(path.read_text()).body)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.add(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


def test_the_graph_is_read() -> None:
    g = import_graph(typing=False)
    assert "gtrain.providers.base" in g["gtrain.providers.aws.provider"]
    assert "gtrain.sync.s3" in g["gtrain.sync.objstore"]  # a function-level import counts
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_no_import_cycle() -> None:
    assert cycles(import_graph(typing=False)) == []


def _inside_one_provider(cycle: set[str]) -> bool:
    """A provider's own parts naming each other in annotations (its JobBackend types its provider, which hands
    the backend out): the same seam, kept inside the provider's folder."""
    pkgs = {".".join(m.split(".")[:3]) for m in cycle}
    return len(pkgs) == 1 and next(iter(pkgs)).startswith("gtrain.providers.")


def test_no_typing_cycle_but_the_seams() -> None:
    extra = [c for c in cycles(import_graph(typing=True)) if c not in TYPING_SEAMS and not _inside_one_provider(c)]
    assert extra == []


def test_no_file_over_500_lines() -> None:
    long = {str(p.relative_to(ROOT.parent)): n for p in ROOT.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


#: what shared code (gtrain outside gtrain/providers/) may import of the providers: the seam, nothing behind it
PROVIDER_SEAM = {"gtrain.providers", "gtrain.providers.base", "gtrain.providers.registry"}


def test_shared_code_imports_no_provider() -> None:
    """Shared modules reach a provider's code only through the seam (base, registry, ``provider_class``): a TPU
    type is read through ``registry.accelerator_shape``, a provider's price list through ``CATALOG_REFRESH``."""
    g = import_graph(typing=True)
    leaks = {mod: sorted(t for t in targets if t.startswith("gtrain.providers.") and t not in PROVIDER_SEAM)
             for mod, targets in g.items() if mod != "gtrain.providers" and not mod.startswith("gtrain.providers.")}
    assert {m: t for m, t in leaks.items() if t} == {}
    # the check reads what it means to: a provider importing another's parts is not shared code
    assert "gtrain.providers.gcp.api" in g["gtrain.providers.tpu.slices"]
