"""The type stubs (tandem/_tandem.pyi) describe the native module exactly:
every public name, class, method and property, and every signature."""

import ast
import inspect
import pathlib

import tandem
from tandem import _tandem

STUB = pathlib.Path(tandem.__file__).with_name("_tandem.pyi")


def stub_tree():
    return ast.parse(STUB.read_text())


def params_of(fn: ast.FunctionDef):
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    out = names + (["*" + a.vararg.arg] if a.vararg else (["*"] if a.kwonlyargs else []))
    out += [p.arg for p in a.kwonlyargs]
    if a.kwarg:
        out.append("**" + a.kwarg.arg)
    return out


def runtime_params(obj):
    sig = inspect.signature(obj)
    out = []
    star = False
    for p in sig.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            out.append("*" + p.name)
            star = True
        elif p.kind is p.KEYWORD_ONLY and not star:
            out.append("*")
            star = True
            out.append(p.name)
        elif p.kind is p.VAR_KEYWORD:
            out.append("**" + p.name)
        else:
            out.append(p.name)
    if out and out[0] in ("self", "cls"):
        out = out[1:]
    return out


def test_every_public_name_is_stubbed_and_every_stub_exists():
    tree = stub_tree()
    stubbed = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            stubbed.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            stubbed.add(node.target.id)
    public = {n for n in dir(_tandem) if not n.startswith("_")} | {"__version__"}
    stubbed = {n for n in stubbed if not n.startswith("_") or n == "__version__"}
    assert stubbed == public
    assert set(tandem.__all__) == public


def test_classes_methods_and_signatures_match():
    for node in stub_tree().body:
        if not isinstance(node, ast.ClassDef):
            continue
        cls = getattr(_tandem, node.name)
        if issubclass(cls, BaseException):
            base = node.bases[0].id
            assert cls.__mro__[1].__name__ == base, node.name
            continue
        stub_members = {}
        for item in node.body:
            # Protocol methods (`__iter__`, `__len__`) are stubbed for type
            # checkers; the comparison covers public names and `__init__`.
            public_or_init = not item.name.startswith("_") or item.name == "__init__"
            if isinstance(item, ast.FunctionDef) and public_or_init:
                stub_members[item.name] = item
        runtime_members = {n for n in vars(cls) if not n.startswith("_")}
        if "__init__" in stub_members:
            runtime_members.add("__init__")
        assert set(stub_members) == runtime_members, node.name
        for name, fn in stub_members.items():
            attr = inspect.getattr_static(cls, name if name != "__init__" else "__new__")
            is_prop = any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list)
            if is_prop:
                assert not callable(getattr(attr, "__get__", None)) or not inspect.isroutine(attr), \
                    f"{node.name}.{name} is a method, stubbed as a property"
                continue
            target = getattr(cls, name) if name != "__init__" else cls
            assert params_of(fn) == runtime_params(target), f"{node.name}.{name}"


def test_docstrings_read_like_the_rust_docs():
    assert "Trains a GNN on a dataset" in tandem.Trainer.__doc__
    assert "Ctrl-C" in tandem.Trainer.__doc__
    assert "used in place" in tandem.Dataset.from_arrays.__doc__
    assert tandem.ConfigError.__doc__ and "origin" in tandem.ConfigError.__doc__
