"""The public API of geoarray, as its ``__all__`` lists define it, and the pages that document it.

A *public module* is ``geoarray``, each submodule it loads lazily (``geoarray._LAZY_SUBMODULES``) and
every module named in a public module's ``__all__`` (``geoarray.optim.transforms``, ``geoarray.torch.nn``,
...). Each gets one API page listing every name of its ``__all__``; an object exported by several public
modules is described once, on the page of the public module its ``__module__`` lies in, and linked from
the others.

:func:`undocumented` is the check that makes the docs build fail on a public name without a docstring
(a class or function without its own ``__doc__``, a constant without a ``#:`` comment). It needs no
Sphinx, so ``tests/test_public_docs.py`` runs it in every test session; the Sphinx extension
(:func:`setup`) writes the API pages and turns every finding into a warning, which ``-W`` makes an error.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import types
from pathlib import Path

ROOT_MODULE = "geoarray"


def public_modules(missing: dict[str, str] | None = None) -> list[str]:
    """Names of the public modules, sorted; each is imported here.

    With ``missing`` (a dict), a module whose import fails for want of an optional dependency (torch,
    jax, optax, ...) is recorded there as ``{module: dependency}`` and left out, so the check can run in
    a test session without that dependency; without it, such a failure raises (the docs build).
    """
    root = importlib.import_module(ROOT_MODULE)
    todo = [ROOT_MODULE, *(f"{ROOT_MODULE}.{name}" for name in sorted(root._LAZY_SUBMODULES))]
    seen: list[str] = []
    while todo:
        name = todo.pop(0)
        if name in seen or (missing is not None and name in missing):
            continue
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            # a missing dependency, raised as it is or wrapped by the module's own message (geoarray.jax:
            # "geoarray.jax needs JAX: pip install ...", from the ModuleNotFoundError)
            cause = exc if isinstance(exc, ModuleNotFoundError) else exc.__cause__
            dependency = getattr(cause, "name", None) if isinstance(cause, ModuleNotFoundError) else None
            if missing is None or dependency is None or dependency.split(".")[0] == ROOT_MODULE:
                raise
            missing[name] = dependency
            continue
        seen.append(name)
        for member in getattr(module, "__all__", ()):
            value = getattr(module, member)
            if isinstance(value, types.ModuleType) and value.__name__.startswith(ROOT_MODULE + "."):
                todo.append(value.__name__)
    return sorted(seen)


def _home(obj: object, modules: list[str]) -> str | None:
    """The public module an object is described in: the longest public prefix of its ``__module__``."""
    where = getattr(obj, "__module__", None)
    if not isinstance(where, str):
        return None
    candidates = [m for m in modules if where == m or where.startswith(m + ".")]
    return max(candidates, key=len) if candidates else None


def _kind(obj: object) -> str:
    if isinstance(obj, types.ModuleType):
        return "module"
    if inspect.isclass(obj):
        return "class"
    if callable(obj) and hasattr(obj, "__name__"):
        return "function"
    return "data"


def _own_doc(obj: object) -> str:
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__") or ""
        # a NamedTuple or dataclass without a docstring gets a generated one: "Name(field, ...)"
        if doc.startswith(f"{obj.__name__}(") and doc.rstrip().endswith(")") and "\n" not in doc.strip():
            return ""
        return doc.strip()
    return (getattr(obj, "__doc__", None) or "").strip()


def _attr_docs(module_name: str) -> dict[str, str]:
    """``#:`` doc-comments of a module's top-level assignments, read from its source as autodoc reads
    them (the comment lines right above ``NAME = ...``), without importing Sphinx."""
    module = importlib.import_module(module_name)
    path = getattr(module, "__file__", None)
    if path is None:
        return {}
    source = Path(path).read_text(encoding="utf-8")
    lines = source.splitlines()
    docs = {}
    for node in ast.parse(source).body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        names = [n for t in targets for n in (t.elts if isinstance(t, ast.Tuple) else [t]) if isinstance(n, ast.Name)]
        for target in names:
            comment, i = [], node.lineno - 2
            while i >= 0 and lines[i].lstrip().startswith("#:"):
                comment.insert(0, lines[i].lstrip()[2:].strip())
                i -= 1
            if comment:
                docs[target.id] = "\n".join(comment)
    return docs


def _data_source(module_name: str, name: str) -> str:
    """The module whose source assigns ``name`` (a constant re-exported by a package is assigned below it)."""
    module = importlib.import_module(module_name)
    path = getattr(module, "__file__", None)
    if path is None:
        return module_name
    if Path(path).name != "__init__.py":
        return module_name
    package = Path(path).parent
    for file in sorted(package.rglob("*.py")):
        dotted = ".".join((module_name, *file.relative_to(package).with_suffix("").parts)).removesuffix(".__init__")
        text = "\n" + file.read_text(encoding="utf-8")
        if f"\n{name} =" in text or f"\n{name}: " in text:
            return dotted
    return module_name


def entries(module_name: str, modules: list[str]) -> list[tuple[str, str, str, str | None]]:
    """(name, kind, target, home) for every name in the module's ``__all__``: the object's dotted target
    and the public module it is described in (None: described here)."""
    module = importlib.import_module(module_name)
    out = []
    for name in module.__all__:
        obj = getattr(module, name)
        kind = _kind(obj)
        if kind == "module":
            out.append((name, kind, obj.__name__, obj.__name__))
            continue
        home = _home(obj, modules) if kind != "data" else module_name
        if home is None or not hasattr(importlib.import_module(home), name):
            home = module_name
        out.append((name, kind, f"{home}.{name}", None if home == module_name else home))
    return out


def undocumented(modules: list[str] | None = None) -> list[str]:
    """'module.name: why' for every public name without documentation; empty when all are documented."""
    modules = public_modules() if modules is None else modules
    problems = []
    for module_name in modules:
        module = importlib.import_module(module_name)
        if not (module.__doc__ or "").strip():
            problems.append(f"{module_name}: the module has no docstring")
        if not hasattr(module, "__all__"):
            problems.append(f"{module_name}: a public module without __all__")
            continue
        attr_docs = None
        for name in module.__all__:
            if not hasattr(module, name):
                problems.append(f"{module_name}.{name}: listed in __all__ but not defined")
                continue
            obj = getattr(module, name)
            kind = _kind(obj)
            if kind == "module":
                continue
            if kind == "data":
                if name == "__version__":
                    continue
                source = _data_source(module_name, name)
                docs = _attr_docs(source) if source != module_name else (attr_docs or _attr_docs(module_name))
                if not docs.get(name):
                    problems.append(f"{module_name}.{name}: a constant without a '#:' doc-comment in {source}")
                continue
            if not _own_doc(obj):
                problems.append(f"{module_name}.{name}: the {kind} has no docstring")
    return problems


_MISSING = object()
_UNCHECKED = object()  # names a module whose optional dependency (torch, jax) this environment lacks
_ROLE = re.compile(r":(func|class|meth|mod|data|attr|exc|obj):`(?:[^`<]*<)?~?\.?([\w.]+)>?`")


def resolve(target: str, module: str | None = None, cls: str | None = None) -> object:
    """The object a Python cross-reference names, looked up as Sphinx does (absolute, then relative to
    the current class and module, then to each parent package); ``_MISSING`` if nothing has that name,
    ``_UNCHECKED`` if the name leads into a module whose optional dependency is not installed."""
    return resolve_named(target, module, cls)[0]


def resolve_named(target: str, module: str | None = None, cls: str | None = None) -> tuple[object, str]:
    """:func:`resolve`, with the full dotted name under which the object was found."""
    contexts = [""]
    if module:
        parts = module.split(".")
        if cls:
            contexts.insert(0, f"{module}.{cls}.")
        contexts += [".".join(parts[:i]) + "." for i in range(len(parts), 0, -1)]
    for prefix in contexts:
        path = (prefix + target).split(".")
        for i in range(len(path), 0, -1):
            try:
                obj: object = importlib.import_module(".".join(path[:i]))
            except ImportError:
                continue
            try:
                for attr in path[i:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                break
            except ImportError:  # a lazy submodule whose framework is not installed here: not checkable
                return _UNCHECKED, prefix + target
            return obj, prefix + target
    return _MISSING, target


def enclosing_page(name: str, modules: list[str]) -> str | None:
    """The public module whose API page covers the dotted ``name`` (the longest public prefix), or None
    for a private name (a component starting with ``_``) or one outside the public modules."""
    if any(part.startswith("_") for part in name.split(".")):
        return None
    homes = [m for m in modules if name == m or name.startswith(m + ".")]
    return max(homes, key=len) if homes else None


_PUBLIC_NAMES: dict[int, str] = {}


def _public_name(obj: object) -> str | None:
    """Where the API pages describe ``obj`` (``home.name``, ``home.Class.method``), or None."""
    if not _PUBLIC_NAMES:
        modules = public_modules({})
        for module_name in modules:
            for name, kind, target, home in entries(module_name, modules):
                if kind in ("class", "function") and home is None:
                    value = getattr(importlib.import_module(module_name), name)
                    _PUBLIC_NAMES[id(value)] = target
                    if kind == "class":
                        for attr, member in vars(value).items():
                            _PUBLIC_NAMES.setdefault(
                                id(inspect.unwrap(member) if callable(member) else member), f"{target}.{attr}"
                            )
    return _PUBLIC_NAMES.get(id(obj))


def public_docstrings(modules: list[str] | None = None):
    """(where, docstring, home module, class name or None) for every public module, class, function and
    method defined in a public class — the docstrings the API pages render."""
    modules = public_modules({}) if modules is None else modules
    seen: set[int] = set()

    def doc_of(obj: object) -> str:
        if isinstance(obj, types.ModuleType):
            return obj.__doc__ or ""
        return (_own_doc(obj) if inspect.isclass(obj) else getattr(obj, "__doc__", None)) or ""

    for module_name in modules:
        module = importlib.import_module(module_name)
        yield module_name, doc_of(module), module_name, None
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, types.ModuleType) or id(obj) in seen or not (inspect.isclass(obj) or callable(obj)):
                continue
            seen.add(id(obj))
            home = getattr(obj, "__module__", None) or module_name
            yield f"{module_name}.{name}", doc_of(obj), home, name if inspect.isclass(obj) else None
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    function = getattr(member, "__func__", getattr(member, "fget", member))
                    # methods defined in this class, not class attributes that alias another object
                    defined_here = getattr(function, "__qualname__", "").startswith(obj.__qualname__ + ".")
                    if not attr.startswith("_") and defined_here:
                        yield f"{module_name}.{name}.{attr}", doc_of(function), home, name


def broken_references(modules: list[str] | None = None) -> list[str]:
    """'where: role `target`' for every cross-reference in a public docstring that names nothing: a
    renamed or removed function, a typo. (References to objects that exist but are not public are
    allowed; the docs render them as text.)"""
    problems = []
    for where, doc, module, cls in public_docstrings(modules):
        for role, target in _ROLE.findall(doc):
            # :attr: may name an instance attribute, which exists only on instances: not checkable here
            if role != "attr" and resolve(target, module, cls) is _MISSING:
                problems.append(f"{where}: :{role}:`{target}` names nothing")
    return problems


# A line of Python as a docstring example writes it: an import, an assignment from a call
# (``opt = geoarray.optim.Adam(lr=1e-3)``, ``params, state = opt.update(...)``), a bare call
# (``loss.backward()``), or a compound statement's header (``for x, y in loader:``). Before any comment
# the line is ASCII without inline literals: formulas written as text (``Y_new = polar(Y − lr·A*)``) and
# prose about code are not code.
_CODE_LINE = re.compile(
    r"""^(?:
        import\ [\w.]+(?:\ as\ \w+)?(?:,\ *[\w.]+(?:\ as\ \w+)?)*
      | from\ [\w.]+\ import\ .+
      | [A-Za-z_][\w.]*(?:\[[^\]]*\])?(?:,\ *[A-Za-z_][\w.]*)*\ *[-+*/@]?=\ *[A-Za-z_][\w.]*(?:\[[^\]]*\])?\(.*
      | [A-Za-z_][\w.]*\(.*\)
      | for\ [\w, ()]+\ in\ .+:
      | with\ .+\ as\ .+:
      | (?:async\ )?def\ \w+\(.*\).*:
      | class\ \w+.*:
    )\s*(?:\#.*)?$""",
    re.VERBOSE,
)


def _is_code_line(line: str) -> bool:
    code = line.strip().split("  #", 1)[0]
    return code.isascii() and "``" not in code and _CODE_LINE.match(line.strip()) is not None


# what makes an indented block render as code: a line ending in "::" or a code directive before it
_LITERAL_INTRO = re.compile(r"(::\s*$)|^\s*\.\. (code-block|code|sourcecode|doctest|testcode|ipython)::")


def _paragraphs(text: str) -> list[tuple[int, list[str]]]:
    """(index of the first line, lines) of every run of non-blank lines of a cleaned docstring."""
    lines = inspect.cleandoc(text).splitlines()
    runs, start = [], None
    for i, line in enumerate([*lines, ""]):
        if line.strip() and start is None:
            start = i
        elif not line.strip() and start is not None:
            runs.append((start, lines[start:i]))
            start = None
    return runs


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def code_outside_literal_blocks(text: str) -> list[str]:
    """The first line of every paragraph of ``text`` (a docstring) that is Python code — each of its
    lines a statement or the continuation of one (indented deeper, a closing bracket or a comment) —
    but that docutils renders as prose: not inside a literal block opened by a line ending in ``::``
    or by a code directive. Doctest blocks (``>>>``) render as code by themselves and pass."""
    lines = inspect.cleandoc(text).splitlines()
    problems = []
    for start, paragraph in _paragraphs(text):
        first = paragraph[0]
        if first.lstrip().startswith(">>>") or not _is_code_line(first):
            continue
        base = _indent(first)
        rest_is_code = all(
            _indent(line) > base or line.strip()[0] in ")]}#" or _is_code_line(line) for line in paragraph[1:]
        )
        if not rest_is_code:
            continue
        # the enclosing block: the nearest earlier non-blank line indented less than the paragraph
        intro = next((line for line in reversed(lines[:start]) if line.strip() and _indent(line) < base), None)
        if intro is None or not _LITERAL_INTRO.search(intro):
            problems.append(first.strip())
    return problems


def unrendered_examples(modules: list[str] | None = None) -> list[str]:
    """'where: line' for every public docstring's code example that the API pages would render as a
    paragraph (a block without ``::``)."""
    return [
        f"{where}: {line!r} is code outside a literal block (end the line before it with '::')"
        for where, doc, _, _ in public_docstrings(modules)
        for line in code_outside_literal_blocks(doc)
    ]


def render(module_name: str, modules: list[str]) -> str:
    """The reStructuredText of one API page."""
    title = f"``{module_name}``"
    lines = [title, "=" * len(title), "", f".. automodule:: {module_name}", "   :no-members:", ""]
    rows = entries(module_name, modules)
    submodules = [r for r in rows if r[1] == "module"]
    here = [r for r in rows if r[1] != "module" and r[3] is None]
    elsewhere = [r for r in rows if r[1] != "module" and r[3] is not None]
    if submodules:
        lines += ["Public submodules", "-----------------", ""]
        lines += [f"- :doc:`{target}`" for _, _, target, _ in submodules] + [""]
    if elsewhere:
        lines += ["Re-exported here", "----------------", ""]
        lines += [
            f"- :py:obj:`{name} <{target}>` (described in :doc:`{home}`)" for name, _, target, home in elsewhere
        ] + [""]
    if here:
        lines += ["Contents", "--------", ""]
        summarised = [name for name, kind, _, _ in here if kind != "data"]
        if summarised:
            lines += [".. autosummary::", ""] + [f"   {name}" for name in summarised] + [""]
        directive = {"class": "autoclass", "function": "autofunction"}
        for name, kind, _, _ in here:
            if kind == "data":
                lines += _render_data(module_name, name)
                continue
            lines += [f".. {directive[kind]}:: {name}"]
            if kind == "class":
                lines += ["   :members:", "   :show-inheritance:"]
                # methods a public class takes from geoarray's own (often private) bases are part of its
                # API; those of tuple, torch.optim.Optimizer, ... are documented by their projects
                obj = getattr(importlib.import_module(module_name), name)
                foreign = sorted({c.__name__ for c in obj.__mro__[1:] if not c.__module__.startswith(ROOT_MODULE)})
                if len(foreign) < len(obj.__mro__) - 1:
                    lines += [f"   :inherited-members: {', '.join(foreign)}"]
            lines += [""]
    return "\n".join(lines)


def _render_data(module_name: str, name: str) -> list[str]:
    """A constant: its ``#:`` doc-comment from the module that assigns it (autodoc would look only in
    ``module_name`` and fall back to the docstring of the value's type)."""
    value = getattr(importlib.import_module(module_name), name)
    if name == "__version__":
        doc = "The version of the installed package (PEP 440)."
    else:
        doc = _attr_docs(_data_source(module_name, name)).get(name, "")
    lines = [f".. py:data:: {name}", f"   :type: {type(value).__name__}"]
    if len(repr(value)) <= 80:
        lines += [f"   :value: {value!r}"]
    return [*lines, "", *(f"   {line}" for line in doc.splitlines()), ""]


def write_pages(outdir: Path) -> list[str]:
    """Write one page per public module and the index; returns the module names."""
    modules = public_modules()
    outdir.mkdir(parents=True, exist_ok=True)
    for module_name in modules:
        page = outdir / f"{module_name}.rst"
        text = render(module_name, modules)
        if not page.exists() or page.read_text(encoding="utf-8") != text:  # unchanged pages stay cached
            page.write_text(text, encoding="utf-8")
    for stale in outdir.glob(f"{ROOT_MODULE}*.rst"):
        if stale.stem not in modules:
            stale.unlink()
    return modules


def setup(app):  # the Sphinx extension
    import functools

    from sphinx.util import logging

    _modules = functools.cache(lambda: public_modules({}))

    logger = logging.getLogger(__name__)

    def generate(app) -> None:
        modules = write_pages(Path(app.srcdir) / "api")
        for problem in undocumented(modules):
            logger.warning("undocumented public name: %s", problem)
        for problem in broken_references(modules):
            logger.warning("broken reference in a docstring: %s", problem)
        for problem in unrendered_examples(modules):
            logger.warning("docstring example rendered as prose: %s", problem)

    def link_to_public_name(app, env, node, contnode):
        # :func:`geoarray.gauge.counting.redundancy` names an object where it is defined; the API pages
        # describe it where users import it (geoarray.gauge.redundancy): link there
        if node.get("refdomain") != "py":
            return None
        if node.get("reftarget") in ("'Array'", "TypeAliasForwardRef"):
            # the Array alias as Sphinx writes it inside a subscripted annotation (tuple[Array, Array]
            # under ``from __future__ import annotations``): the same name, described on api/index
            domain = env.get_domain("py")
            return domain.resolve_xref(env, node["refdoc"], app.builder, "class", "Array", node, contnode)
        target, module, cls = node.get("reftarget", ""), node.get("py:module"), node.get("py:class")
        obj, name = resolve_named(target, module, cls)
        if obj is _MISSING and module and cls:
            # a docstring is written where its class is defined (geoarray.manifolds.sections) and rendered
            # where it is exported (geoarray.manifolds): resolve it in the defining module too
            owner = resolve(cls, module)
            if owner is not _MISSING and owner is not _UNCHECKED and hasattr(owner, "__module__"):
                obj, name = resolve_named(target, owner.__module__, owner.__qualname__)
        if obj is _MISSING and "." not in target:
            # a function's docstring names a class of the package by its short name (TransformerLM in
            # geoarray.gauge.counting.redundancy): link it when exactly one public name is spelled so
            _public_name(None)  # fills the table
            matches = {full for full in _PUBLIC_NAMES.values() if full.rsplit(".", 1)[-1] == target}
            if len(matches) == 1:
                obj, name = resolve_named(matches.pop())
        if obj is _MISSING or obj is _UNCHECKED:
            return None
        canonical = _public_name(obj)
        if canonical is not None and canonical != node.get("reftarget"):
            domain = env.get_domain("py")
            found = domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], canonical, node, contnode)
            if found is not None:
                return found
        # an implementation module or object with no public name of its own (geoarray.manifolds.sections,
        # geoarray.gauge.counting, ...): link to the API page of the public module that contains it
        page = enclosing_page(name, _modules())
        if page is None:
            return None  # private names: conf.py's nitpick_ignore_regex says why they are not linked
        from sphinx.util.nodes import make_refnode

        return make_refnode(app.builder, node["refdoc"], f"api/{page}", None, contnode, name)

    def drop_field_alias(app, what, name, obj, options, lines) -> None:
        # a NamedTuple field's generated doc says nothing its name and type do not
        text = [line for line in lines if line.strip()]
        if len(text) == 1 and text[0].startswith("Alias for field number"):
            lines.clear()

    def tidy_alias(app, doctree) -> None:
        # inside a subscripted annotation (tuple[Array, Array]) Sphinx 9 writes the Array alias as
        # TypeAliasForwardRef('Array'): the wrapper's name, "(", the quoted name, ")" as sibling nodes
        # (plain text in signatures, emphasis in parameter lists). Put the plain name back, linked to
        # its description.
        from docutils import nodes
        from sphinx.addnodes import pending_xref

        def strip_first(node: nodes.Node) -> None:  # drop the node's first character ("(" or ")")
            text = node.astext()[1:]
            if not text:
                node.parent.remove(node)
            elif isinstance(node, nodes.Text):
                node.parent.replace(node, nodes.Text(text))
            else:
                node.children = [nodes.Text(text)]

        for ref in list(doctree.findall(pending_xref)):
            if ref.get("reftarget") != "TypeAliasForwardRef" or ref.parent is None:
                continue
            siblings = ref.parent.children
            i = siblings.index(ref)
            after = siblings[i + 1 : i + 4]
            if not (
                len(after) == 3
                and after[0].astext().startswith("(")
                and isinstance(after[1], pending_xref)
                and after[1].get("reftarget") == "'Array'"
                and after[2].astext().startswith(")")
            ):
                continue
            ref.parent.remove(after[1])
            strip_first(after[0])
            strip_first(after[2])
            ref["reftarget"] = "Array"
            for text in list(ref.findall(nodes.Text)):
                text.parent.replace(text, nodes.Text("Array"))

    app.connect("builder-inited", generate)
    app.connect("doctree-read", tidy_alias)
    app.connect("missing-reference", link_to_public_name)
    app.connect("autodoc-process-docstring", drop_field_alias)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
