"""The spec's YAML loader: PyYAML's safe loader with the limits a hostile or mistyped file needs.

- a document over :data:`MAX_BYTES` is refused before it is parsed;
- nesting deeper than :data:`MAX_DEPTH` is refused while it is composed (no ``RecursionError``);
- aliases may not expand the document past :data:`MAX_VALUES` values (a "billion laughs" is refused in
  milliseconds, before anything walks or prints the expanded value), and may not refer to themselves;
- a mapping of more than :data:`MAX_KEYS` keys, or a list of more items, is refused while it is composed;
- a key given twice in one mapping is refused with both line numbers, at any depth;
- the names and values of ``job.env`` are kept as the text written in the file (``0.00001``, ``0755``,
  ``yes``, ``12:30`` and ``1_000`` stay as they are; quoted and block scalars keep their spaces and
  newlines), never converted through a YAML number or boolean; a list or mapping there is refused;
- a mapping key is the name as written: ``on:`` (``policies.recovery.on``) is the key ``"on"``, not YAML
  1.1's ``True`` (values keep their YAML types: ``enabled: yes`` is still true);
- a YAML merge key (``<<: *base``) is refused anywhere in a spec: it hides which value a field gets, and the
  duplicate-key check cannot see through it (an alias of a whole value, ``x: *base``, is fine). A file that is
  not a spec (a kubeconfig, an accelerate config file: their own tools take merge keys) is read with
  ``load(..., merge=True)``.

Every refusal is a :class:`~gtrain.errors.ConfigError` (exit 2) naming the file, the line and the field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from gtrain.errors import ConfigError, dotted_path

MAX_BYTES = 1 << 20  # 1 MiB: a spec is a few hundred bytes; a 512-host ssh list is ~30 KiB
MAX_DEPTH = 50  # the deepest real field (ssh.hosts[K].host) is at depth 4
MAX_VALUES = 50_000  # scalars + lists + mappings after alias expansion
MAX_KEYS = 5_000  # keys of one mapping, items of one list: real ones hold tens (512 ssh hosts at most);
#                  composing 24,000 keys or 45,000 items took over 1 s of CPU
STR_TAG = "tag:yaml.org,2002:str"
MERGE_TAG = "tag:yaml.org,2002:merge"
NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
MAX_DIGITS = 100  # Python refuses to convert an integer of 4,300 digits; no field needs 100
BOOL_TAG = "tag:yaml.org,2002:bool"


if TYPE_CHECKING:
    _Base = yaml.SafeLoader
else:
    try:  # libyaml's scanner and parser under PyYAML's Python composer (ours, below): ~6x faster, same limits
        from yaml._yaml import CParser as _Parser

        class _Base(Composer, _Parser, SafeConstructor, Resolver):
            def __init__(self, stream):
                _Parser.__init__(self, stream)
                SafeConstructor.__init__(self)
                Resolver.__init__(self)
                Composer.__init__(self)
    except ImportError:  # PyYAML built without libyaml
        _Base = yaml.SafeLoader


class _SpecLoader(_Base):
    """SafeLoader whose composer counts depth and expanded size and rejects duplicate keys."""

    def __init__(self, stream: str, source: str, merge: bool = False) -> None:
        super().__init__(stream)
        self.source = source
        self.merge = merge  # False (a spec): a merge key is refused, wherever it is
        self.path: list[Any] = []
        self.sizes: dict[int, int] = {}  # id(node) -> its size with aliases expanded; absent while composing

    def refuse(self, node_or_mark: Any, what: str, hint: str, path: list[Any] | None = None) -> ConfigError:
        mark = getattr(node_or_mark, "start_mark", node_or_mark)
        field = dotted_path(self.path if path is None else path) or "SPEC"
        where = f" at line {mark.line + 1}" if mark is not None else ""
        return ConfigError(f"{self.source}{where}: {field}: {what}", hint=hint, field=field)

    def fetch_flow_collection_start(self, token_class: Any) -> None:
        # PyYAML's scanner looks ahead over every open `[`/`{` (quadratic): stop before the composer would.
        if self.flow_level >= MAX_DEPTH:
            raise self.refuse(self.get_mark(), f"nested more than {MAX_DEPTH} levels deep",
                              "a spec is a few levels of mappings; check the brackets and indentation",
                              path=self.path[:2])
        super().fetch_flow_collection_start(token_class)

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if isinstance(parent, MappingNode) and isinstance(index, ScalarNode):
            self.path.append(index.value)
        elif isinstance(parent, SequenceNode):
            if index >= MAX_KEYS:
                raise self.refuse(self.peek_event().start_mark, f"a list of more than {MAX_KEYS:,} items",
                                  "a spec's lists hold at most a few hundred items (ssh hosts, secrets); is this "
                                  "the right file?", path=self.path[:2])
            self.path.append(index)
        else:
            self.path.append(None)  # a mapping's key, or the root: not a field of its own
            if isinstance(parent, MappingNode) and len(parent.value) >= MAX_KEYS:
                field = self.path[:-1]
                self.path.pop()
                self.path.append(None)
                raise self.refuse(self.peek_event().start_mark, f"a mapping of more than {MAX_KEYS:,} keys",
                                  "a spec's mappings hold a few dozen keys at most; is this the right file?",
                                  path=field[:2])
        try:
            if len(self.path) > MAX_DEPTH:
                raise self.refuse(self.peek_event().start_mark, f"nested more than {MAX_DEPTH} levels deep",
                                  "a spec is a few levels of mappings; check the brackets and indentation",
                                  path=self.path[:2])  # the top-level field, not fifty levels of it
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                node = super().compose_node(parent, index)
                if id(node) not in self.sizes:
                    raise self.refuse(event.start_mark, f"alias *{event.anchor} refers to itself",
                                      "write the value out")
                return node
            node = super().compose_node(parent, index)
            if isinstance(node, ScalarNode) and node.tag in NUMBER_TAGS and len(node.value) > MAX_DIGITS:
                raise self.refuse(node, f"a number of {len(node.value)} characters",
                                  "a spec's numbers have a few digits; quote it if it is text")
            size = 1
            if isinstance(node, SequenceNode):
                size += sum(self.sizes[id(n)] for n in node.value)
            elif isinstance(node, MappingNode):
                size += sum(self.sizes[id(k)] + self.sizes[id(v)] for k, v in node.value)
                for key, _v in node.value:  # `on:` is YAML 1.1's True: a key is the name as written
                    if isinstance(key, ScalarNode) and key.tag == BOOL_TAG and not key.style:  # plain: None, libyaml ""
                        key.tag = STR_TAG
                self._check_duplicates(node)
            if size > MAX_VALUES:
                raise self.refuse(node, f"aliases expand it to more than {MAX_VALUES} values",
                                  "a spec needs far fewer; write the values out instead of nesting aliases")
            self.sizes[id(node)] = size
            return node
        except yaml.YAMLError as e:
            if not hasattr(e, "spec_path"):
                e.spec_path = list(self.path)  # type: ignore[attr-defined]  # where it happened, for the message
            raise
        finally:
            self.path.pop()

    def _check_duplicates(self, node: MappingNode) -> None:
        seen: dict[tuple[str, str], ScalarNode] = {}
        for key, _ in node.value:
            if not isinstance(key, ScalarNode) or key.tag == MERGE_TAG:
                continue
            first = seen.setdefault((key.tag, key.value), key)
            if first is not key:
                raise self.refuse(
                    key, f"key {key.value!r} is given twice, at line {first.start_mark.line + 1} and line "
                    f"{key.start_mark.line + 1}", "keep one of them", path=[*self.path, key.value])

    def compose_document(self) -> Node | None:
        node = super().compose_document()
        if isinstance(node, MappingNode):
            job = _get(node, "job")
            if isinstance(job, MappingNode):
                job.value = [(k, self._env_as_text(v) if _is_key(k, "env") else v) for k, v in job.value]
        if not self.merge:
            self._no_merge(node, [])
        return node

    def _no_merge(self, node: Node | None, path: list[Any]) -> None:
        """A merge key (``<<: *base``) hides which value a field gets (the duplicate check cannot see it)."""
        if isinstance(node, SequenceNode):
            for i, item in enumerate(node.value):
                self._no_merge(item, [*path, i])
        elif isinstance(node, MappingNode):
            for key, value in node.value:
                if key.tag == MERGE_TAG:
                    raise self.refuse(key, "a YAML merge key (<<) is not allowed in a spec: it hides which "
                                      "value a field gets", "write the fields out (an alias of a whole value, "
                                      "`x: *base`, is fine)", path=path)
                self._no_merge(value, [*path, key.value if isinstance(key, ScalarNode) else "?"])

    def _env_as_text(self, env: Node) -> Node:
        """A copy of the ``job.env`` mapping with every name and value tagged as the string it was written as."""
        if not isinstance(env, MappingNode):
            return env  # null or a wrong type: the model says what is wrong
        items: list[tuple[Node, Node]] = []
        for key, value in env.value:
            if key.tag == MERGE_TAG:  # `<<: *base`: the merged mappings' values are text as well
                merged = value.value if isinstance(value, SequenceNode) else [value]
                items.append((key, SequenceNode(value.tag, [self._env_as_text(m) for m in merged],
                                                value.start_mark, value.end_mark)))
                continue
            name = key.value if isinstance(key, ScalarNode) else "?"
            if not isinstance(value, ScalarNode):
                kind = "list" if isinstance(value, SequenceNode) else "mapping"
                raise self.refuse(value, f"a {kind} is not an environment value; quote it ({name}: '...')",
                                  "a value is passed to the job as the text written in the spec",
                                  path=["job", "env", name])
            items.append((_text(key), _text(value)))
        return MappingNode(env.tag, items, env.start_mark, env.end_mark, flow_style=env.flow_style)


def _is_key(node: Node, name: str) -> bool:
    return isinstance(node, ScalarNode) and node.value == name and node.tag == STR_TAG


def _get(mapping: MappingNode, name: str) -> Node | None:
    for k, v in mapping.value:
        if _is_key(k, name):
            return v
    return None


def _text(node: Node) -> Node:
    if not isinstance(node, ScalarNode):
        return node
    return ScalarNode(STR_TAG, node.value, node.start_mark, node.end_mark, style=node.style)


def load(text: str, source: str, *, merge: bool = False) -> Any:
    """Parse one YAML document of a spec file under the limits above (``merge``: allow merge keys, for a file
    that is not a spec)."""
    if len(text) > MAX_BYTES:
        raise ConfigError(f"{source} is over {MAX_BYTES >> 20} MiB; a spec is a few KiB",
                          hint="is this the right file?", field="SPEC")
    loader = None
    try:
        loader = _SpecLoader(text, source, merge)  # its reader refuses NUL and control characters at once
        return loader.get_single_data()
    except ValueError as e:  # a 100,000-digit integer: Python refuses to convert it
        raise ConfigError(f"{source}: {dotted_path(loader.path if loader else []) or 'SPEC'}: a number this "
                          f"long cannot be read ({str(e).split(':')[0]})", hint="write a number of a few digits",
                          field=dotted_path(loader.path if loader else []) or "SPEC") from None
    except yaml.YAMLError as e:
        if "maximum nesting depth" in str(e):  # libyaml's own limit, met while it scans ahead of the composer
            field = dotted_path(getattr(e, "spec_path", [])[:2]) or "SPEC"
            raise ConfigError(f"{source}: {field}: nested more than {MAX_DEPTH} levels deep", field=field,
                              hint="a spec is a few levels of mappings; check the brackets and indentation") from None
        mark = getattr(e, "problem_mark", None)
        hint = "check indentation and quoting"
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if isinstance(e, yaml.reader.ReaderError):
            where, hint = f" at character {e.position + 1}", "remove the control character (NUL, BEL, ...)"
        raise ConfigError(f"{source}: malformed YAML{where}: {problem}", hint=hint,
                          field="SPEC") from None
    finally:
        if loader is not None:
            loader.dispose()
