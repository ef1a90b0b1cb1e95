"""What the start line says of a DataLoader, read from the code that runs: the loop
batches() tracks (each epoch's first) restores its order, a later one does not; the code
is read as Python (comments, aliases and helpers included), in an IPython shell too."""

from __future__ import annotations

import functools
import random
import os
import sys
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ckpt_nb

from ckpt_nb._discovery import discover
from test_magics import run
import warm_python  # (fresh interpreters forked from a warm one)

pytestmark = pytest.mark.usefixtures("fresh_process_state")

RESTORES = "DataLoader: ckpt_nb.batches() restores its order"
WRAP = "DataLoader: wrap it in ckpt_nb.batches() to restore its order"
LATER = ("DataLoader: passed to a later batches() loop alone, a plain enumerate: a resume "
         "does not restore its sampler's or generators' state (batches() tracks each "
         "epoch's first batches() loop; outside epochs(), the cell's first)")
EITHER = ("DataLoader: ckpt_nb.batches() restores its order in the loop it tracks (each "
          "epoch's first batches() loop; outside epochs(), the cell's first)")


def loaders() -> dict[str, Any]:
    data = torch.utils.data.TensorDataset(torch.randn(12, 3))
    return {"loader": torch.utils.data.DataLoader(data, shuffle=True),
            "val_loader": torch.utils.data.DataLoader(data)}


def said(code: str, namespace: dict[str, Any] | None = None) -> dict[str, str]:
    namespace = {**loaders(), **(namespace or {})}
    return discover(namespace, code=code).skipped


VALIDATION_IN_EPOCHS = """
for epoch in ckpt_nb.epochs(4):
    for i, (xb, yb) in ckpt_nb.batches(loader):
        opt.zero_grad()
    with torch.no_grad():
        v = sum(loss(a, b) for _, (a, b) in ckpt_nb.batches(val_loader))
"""

LOOPS_OUTSIDE_EPOCHS = """
for i, (xb, yb) in ckpt_nb.batches(loader):
    opt.zero_grad()
model.eval()
with torch.no_grad():
    for j, (vx, vy) in ckpt_nb.batches(val_loader):
        pass
"""


@pytest.mark.parametrize("code", [VALIDATION_IN_EPOCHS, LOOPS_OUTSIDE_EPOCHS])
def test_a_loader_in_a_later_loop_is_not_said_to_be_restored(code: str) -> None:
    """A validation loader in the epoch's second batches() loop was said 'ckpt_nb.batches()
    restores its order', where batches() runs that loop as a plain enumerate and saves
    none of its sampler's state (an epoch-counting sampler resumed at 4 where 1)."""
    skipped = said(code)
    assert skipped == {"loader": RESTORES, "val_loader": LATER}, skipped


def test_a_loader_the_code_may_track_or_not_is_said_in_general() -> None:
    """Where a branch decides which loop is first, neither is said to be restored or
    not: the general wording says which loop batches() tracks."""
    skipped = said("""
for epoch in ckpt_nb.epochs(2):
    if epoch % 2:
        for i, b in ckpt_nb.batches(loader): pass
    for j, b in ckpt_nb.batches(val_loader): pass
""")
    assert skipped == {"loader": RESTORES, "val_loader": EITHER}, skipped
    assert said("for for\n")["loader"] == EITHER  # (code that is not Python: unknown)


def test_a_comment_naming_batches_passes_no_loader() -> None:
    """A comment '# ... ckpt_nb.batches(val_loader)' made val_loader 'restored'."""
    skipped = said("""
for epoch in ckpt_nb.epochs(1):
    for i, b in ckpt_nb.batches(loader):
        pass  # and not ckpt_nb.batches(val_loader), nor in "ckpt_nb.batches(val_loader)"
""")
    assert skipped == {"loader": RESTORES, "val_loader": WRAP}, skipped


def test_another_name_for_a_passed_loader_is_said_restored_too() -> None:
    """``dl = loader`` and ``batches(dl)``: loader was told to be wrapped in batches()."""
    namespace = loaders()
    namespace["dl"] = namespace["loader"]
    skipped = discover(namespace, code="for i, b in ckpt_nb.batches(dl): pass").skipped
    assert skipped == {"loader": RESTORES, "val_loader": WRAP, "dl": RESTORES}, skipped


def run_epoch(ld: Any, log: bool = False) -> None:
    import ckpt_nb
    for _ in ckpt_nb.batches(ld):
        pass


def test_a_loader_passed_to_a_helper_that_batches_it_is_said_restored() -> None:
    """``run_epoch(loader)``, a function calling batches() with its parameter: loader was
    told to be wrapped in batches(). The helper's argument is the one counted, by
    position or by keyword."""
    helper = {"run_epoch": run_epoch}
    for code in ("for epoch in ckpt_nb.epochs(1):\n    run_epoch(loader)\n",
                 "run_epoch(log=True, ld=loader)\n"):
        skipped = said(code, helper)
        assert skipped == {"loader": RESTORES, "val_loader": WRAP}, (code, skipped)
    in_the_code = "def go(a, b):\n    list(ckpt_nb.batches(b))\ngo(val_loader, loader)\n"
    assert said(in_the_code) == {"loader": RESTORES, "val_loader": WRAP}


class LoaderTrainer:
    """A user's trainer holding its loader, batching it in a method."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def fit(self, epochs: int) -> None:
        import ckpt_nb
        for _ in ckpt_nb.epochs(epochs):
            self.one_epoch()

    def one_epoch(self) -> None:
        import ckpt_nb
        for _ in ckpt_nb.batches(self.loader):
            pass

    def plain(self) -> None:
        for _ in self.loader:
            pass

    def then(self, other: Any) -> None:
        import ckpt_nb
        self.one_epoch()  # (a method's method: unread, so other's loop is first or later)
        for _ in ckpt_nb.batches(other):
            pass


def test_a_loader_a_trainer_batches_in_its_method_is_said_restored() -> None:
    """``trainer.fit()``, whose method passes ``self.loader`` to batches(): loader was
    told to be wrapped in batches(). The method is read with self bound to trainer; a
    method that iterates its loader plainly still tells to wrap it; one the reader cannot
    see into may pass the loaders its object holds to any loop."""
    def said_of(code: str, ns: dict[str, Any]) -> tuple[str, str]:
        skipped = said(code, ns)
        return skipped["loader"], skipped["val_loader"]

    ns = loaders()
    ns["trainer"] = LoaderTrainer(ns["loader"])
    assert said_of("trainer.one_epoch()", ns) == (RESTORES, WRAP)
    assert said_of("trainer.fit(3)", ns) == (EITHER, WRAP)  # (a method's method: unread)
    assert said_of("trainer.plain()", ns) == (WRAP, WRAP)
    assert said_of("trainer.then(val_loader)", ns) == (EITHER, EITHER)
    assert said_of("LoaderTrainer.one_epoch(trainer)",
                   {**ns, "LoaderTrainer": LoaderTrainer}) == (EITHER, WRAP)
    assert said_of("for epoch in ckpt_nb.epochs(3):\n    trainer.one_epoch()\n"
                   "    for i, b in ckpt_nb.batches(val_loader): pass\n", ns) == (RESTORES, EITHER)
    ns["trainer"].one_epoch = lambda: None  # (an instance's own: not the class's method)
    assert said_of("trainer.one_epoch()", ns) == (EITHER, WRAP)


class Task:
    """A task holding its loader, nested in an experiment (``exp.val.loader``)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader


class Experiment:
    def __init__(self, train: Any, val: Any) -> None:
        self.loader, self.val = train, Task(val)

    def evaluate(self, task: Any) -> None:
        for _ in ckpt_nb.batches(task.loader):
            pass

    def aliased(self) -> None:
        loader = self.val.loader  # (a local, though the notebook has a loader too)
        for _ in ckpt_nb.batches(loader):
            pass

    def handed(self) -> None:
        run_epoch(self.loader)  # (a helper of a method: not read)


def run_task(task: Any) -> None:
    for _ in ckpt_nb.batches(task.loader):
        pass


class SlottedRunner:
    __slots__ = ("loader",)

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    @staticmethod
    def go(loader: Any) -> None:
        for _ in ckpt_nb.batches(loader):
            pass


def test_what_a_method_or_helper_passes_that_the_reader_cannot_name_is_said_in_general() \
        -> None:
    """A reader of methods must not say the wrong loader restored: ``exp.val`` was read as
    ``exp`` (train_loader 'restores', val_loader 'wrap it'); so was a method's local named
    like the notebook's loader; a method's helper, a static method of a slotted object
    and a class defined in the cell itself told 'wrap it'."""
    ns = loaders()
    ns.update(exp=Experiment(ns["loader"], ns["val_loader"]), run_task=run_task,
              slotted=SlottedRunner(ns["loader"]))
    for code in ("run_task(exp.val)", "exp.evaluate(exp.val)",
                 "for b in ckpt_nb.batches(exp.val.loader): pass", "exp.aliased()"):
        assert said(code, ns)["val_loader"] == EITHER, code
        assert said(code, ns)["loader"] in (EITHER, WRAP), code
    assert said("exp.handed()", ns)["loader"] == EITHER
    assert said("slotted.go(slotted.loader)", ns)["loader"] == EITHER
    in_the_cell = ("class Local:\n    def fit(self):\n        for b in ckpt_nb.batches(loader): "
                   "pass\nLocal().fit()\n")
    assert said(in_the_cell, ns)["loader"] == EITHER


SETUP = """
import torch, ckpt_nb
data = torch.utils.data.TensorDataset(torch.randn(40, 3), torch.randint(0, 2, (40,)))
loader = torch.utils.data.DataLoader(data, batch_size=10, shuffle=True)
val_loader = torch.utils.data.DataLoader(data, batch_size=10)
dl = loader
model = torch.nn.Linear(3, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
def run_epoch(ld):
    for i, (xb, yb) in ckpt_nb.batches(ld):
        opt.zero_grad(); torch.nn.functional.cross_entropy(model(xb), yb).backward(); opt.step()
"""

HELPER_CELL = """%%ckpt_auto --dir {dir}
%time x = 1
for epoch in ckpt_nb.epochs(1):
    run_epoch(dl)
    # ckpt_nb.batches(val_loader) is not run
    for j, b in enumerate(val_loader): pass
"""


def test_a_cell_calling_a_helper_of_another_cell_is_read(shell, tmp_path: Path,
                                                         capsys) -> None:
    """The helper defined in an earlier cell is read from its source, the cell with its
    IPython syntax: 'wrap it' was said of loader and 'restores its order' of val_loader."""
    run(shell, SETUP)
    assert run(shell, HELPER_CELL.format(dir=tmp_path / "store")).success
    out = capsys.readouterr().out
    assert f"(TensorDataset), loader, dl ({RESTORES}), val_loader ({WRAP})" in out, out


def test_a_cell_timed_or_captured_under_ckpt_auto_is_read_through_the_magic() -> None:
    """``%%ckpt_auto`` then ``%%time`` (or ``%%capture``): IPython makes the body a string
    given to run_cell_magic, in which no batches() was read, and the start line told the
    user to "wrap it in ckpt_nb.batches()", wrapped as it was."""
    body = VALIDATION_IN_EPOCHS.lstrip("\n")
    for code in (f"%%time\n{body}", f"%%capture out\n{body}", f"%%time\n%%capture\n{body}"):
        assert said(code) == {"loader": RESTORES, "val_loader": LATER}, code
    # (a cell magic whose body is not the cell's Python is not read as code that runs)
    assert said(f"%%writefile x.py\n{body}")["loader"] == WRAP


def test_a_loop_in_a_file_the_cell_runs_with_run_is_read_from_that_file(
        tmp_path: Path) -> None:
    """``%run -i loop.py``, whose loop passes loader to batches(): discovery read only the
    cell, and the start line told the user to wrap loader in ckpt_nb.batches(), wrapped
    as it was. The file is read where the %run stands, anew each time; a %run it cannot
    read (a module, no such file) may pass any loader to batches(): said in general."""
    (tmp_path / "loop.py").write_text(VALIDATION_IN_EPOCHS)
    for line in (f"%run -i {tmp_path / 'loop.py'}", f"%run -n -N 2 {tmp_path / 'loop'} a b",
                 f"if True:\n    %run -i '{tmp_path / 'loop.py'}'"):
        assert said(f"x = 1\n{line}\nprint(x)\n") == {"loader": RESTORES, "val_loader": LATER}, \
            line
    (tmp_path / "loop.py").write_text("for i, b in ckpt_nb.batches(val_loader): pass\n")
    assert said(f"%run -i {tmp_path / 'loop.py'}") == {"loader": WRAP, "val_loader": RESTORES}
    for line in ("%run -m trainer", f"%run {tmp_path / 'none.py'}", "%run $script"):
        assert said(line) == {"loader": EITHER, "val_loader": EITHER}, line
    assert said("%time x = 1")["loader"] == WRAP  # (no %run: as before)


class Noise:
    """A transform drawing from its own generator."""

    def __init__(self) -> None:
        self.g = torch.Generator().manual_seed(1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.randn(x.shape, generator=self.g)


class Augmented(torch.utils.data.Dataset):
    """A map-style Dataset drawing in __getitem__, from its transform's generator, with
    no state_dict()."""

    def __init__(self) -> None:
        self.x = torch.randn(8, 3)
        self.transform = Noise()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.transform(self.x[i])


HELD_NOWHERE = ("Augmented: a Dataset without state_dict() holding transform.g (torch.Generator), "
                "which no checkpoint holds: after a resume the draws of its __getitem__ differ "
                "from an unstopped run's (the replayed batches are fetched again); give it "
                "state_dict()/load_state_dict() holding its state, or assign it to a "
                "notebook variable for checkpoints to hold it")


def test_a_dataset_drawing_from_a_generator_no_checkpoint_holds_is_said_so() -> None:
    """A map-style Dataset without state_dict() was said '(Augmented)' alone, though a
    resume fetches its replayed batches through __getitem__ again, from a generator no
    checkpoint holds (a run killed twice trained other weights). A name in the notebook
    holds it (that resume is exact); so does batches(), for a generator the loader's
    dataset holds itself; a TensorDataset holds none."""
    ds = Augmented()
    loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True)
    assert discover({"ds": ds, "loader": loader}).skipped["ds"] == HELD_NOWHERE
    named = {"ds": ds, "loader": loader, "noise_g": ds.transform.g}
    assert discover(named).skipped["ds"] == "Augmented"
    ds.g = ds.transform.g  # (the dataset's own: the loader's batches() saves it)
    del ds.transform
    assert discover({"ds": ds, "loader": loader}).skipped["ds"] == "Augmented"
    assert discover({"ds": ds}).skipped["ds"] == OWN_UNLESS_BATCHED


OWN_UNLESS_BATCHED = HELD_NOWHERE.replace("transform.g", "g").replace(
    "which no checkpoint holds", "which no checkpoint holds unless a DataLoader over it is "
    "passed to batches(), which saves g (the dataset's own generators, not its attributes')")


def test_a_datasets_own_generator_is_not_said_unheld_where_a_loader_may_hold_it() -> None:
    """A Dataset's own generator, its loader made in the training cell, was said held by
    no checkpoint, though that loader's batches() saves it (the resume was exact)."""
    ds = Augmented()
    ds.g = ds.transform.g
    del ds.transform
    code = "loader = torch.utils.data.DataLoader(ds)\nfor i, b in ckpt_nb.batches(loader): pass\n"
    assert discover({"ds": ds}, code=code).skipped["ds"] == OWN_UNLESS_BATCHED
    both = Augmented()
    both.g = torch.Generator()
    assert "holding transform.g (torch.Generator), g (torch.Generator), which no checkpoint " \
        "holds unless a DataLoader over it is passed to batches(), which saves g " in \
        discover({"ds": both}).skipped["ds"]
    plain = torch.utils.data.TensorDataset(torch.randn(4, 3))
    assert discover({"ds": plain}).skipped["ds"] == "TensorDataset"


def test_generators_a_dataset_holds_are_named_by_their_library() -> None:
    """A NumPy and a torch Generator were both said "(Generator)": which one to hold was
    the user's guess."""
    ds = Augmented()
    ds.np_g = np.random.default_rng(0)
    ds.old = np.random.RandomState(0)
    ds.py = random.Random(0)
    assert "holding transform.g (torch.Generator), np_g (np.random.Generator), old " \
        "(np.random.RandomState), py (random.Random), which " in discover({"ds": ds}).skipped["ds"]


class Parent:
    pass


class WithParent(torch.utils.data.Dataset):
    """A Dataset holding a weak proxy to its parent, which may be gone."""

    def __init__(self, parent: Parent) -> None:
        self.parent = weakref.proxy(parent)

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.zeros(1)


class Slotted:
    """A transform whose __getattr__ raises KeyError (``__dict__`` included)."""

    __slots__ = ("table",)

    def __init__(self) -> None:
        self.table: dict[str, Any] = {}

    def __getattr__(self, key: str) -> Any:
        return self.table[key]


def test_an_attribute_that_raises_when_read_stops_no_discovery() -> None:
    """A dead weakref.proxy (ReferenceError) or a __getattr__ raising KeyError on a
    Dataset's attribute crashed discovery, so every %%ckpt_auto cell failed."""
    ds = WithParent(Parent())  # (the parent is gone at once)
    found = discover({"ds": ds, "model": torch.nn.Linear(1, 1)})
    assert found.skipped == {"ds": "WithParent"} and list(found.statefuls) == ["model"]
    augmented = Augmented()
    augmented.transform = Slotted()
    assert discover({"ds": augmented}).skipped == {"ds": "Augmented"}


def test_code_too_deep_to_parse_is_said_in_general() -> None:
    """A cell too deeply nested to compile (a sum of 5,000 terms) raised RecursionError
    from discovery; it is code the reader cannot read, said in the general wording."""
    assert said("x = " + "+".join(["1"] * 5000) + "\n")["loader"] == EITHER


SCRIPT_MAIN = """import torch, ckpt_nb

def main():
    data = torch.utils.data.TensorDataset(torch.randn(40, 3), torch.randint(0, 2, (40,)))
    loader = torch.utils.data.DataLoader(data, batch_size=10, shuffle=True)
    model = torch.nn.Linear(3, 2)
    with ckpt_nb.auto({store!r}, namespace=locals()):
        for epoch in ckpt_nb.epochs(1):
            for i, (xb, yb) in ckpt_nb.batches(loader):
                model(xb)

main()
"""


def test_auto_in_a_function_reads_that_functions_code(tmp_path: Path) -> None:
    """auto(namespace=locals()) in main(): the code read was the whole file from its top
    level, which skips function bodies, so each loader was told to be wrapped in
    batches()."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT_MAIN.format(store=str(tmp_path / "store")))
    root = str(Path(ckpt_nb.__file__).parent.parent)  # (this checkout's ckpt_nb)
    result = warm_python.run([sys.executable, str(script)], timeout=120, cwd=tmp_path,
                             env={**os.environ, "PYTHONPATH": root})
    assert result.returncode == 0, result.stderr
    assert f"loader ({RESTORES})" in result.stdout + result.stderr, result


def train_one_epoch(loader: Any) -> None:
    for _ in ckpt_nb.batches(loader):
        pass


def fit(train: Any, val: Any, epochs: int) -> None:
    train_one_epoch(train)
    evaluate(val)


@torch.no_grad()
def evaluate(loader: Any) -> None:
    for _ in ckpt_nb.batches(loader):
        pass


def train_global() -> None:
    for _ in ckpt_nb.batches(loader):  # noqa: F821 - this module's global: none
        pass


class Trainer:
    def train_epoch(self, loader: Any) -> None:
        for _ in ckpt_nb.batches(loader):
            pass


IN_EPOCHS = "for epoch in ckpt_nb.epochs(3):\n"
UNREAD = type("Unread", (), {"train_epoch": eval("lambda self, loader: None")})
UNFOLLOWED = {
    "a helper's helper": ("fit(loader, val_loader, 2)\n", EITHER, EITHER),
    "a subscript": (IN_EPOCHS + "    for i, b in ckpt_nb.batches(loaders['train']): pass\n",
                    EITHER, EITHER),
    "a list loop": (IN_EPOCHS + "    for dl in [loader, val_loader]:\n"
                    "        for i, b in ckpt_nb.batches(dl): pass\n", EITHER, EITHER),
    "another module's global": (IN_EPOCHS + "    train_global()\n"
                                "    for i, b in ckpt_nb.batches(val_loader): pass\n",
                                EITHER, EITHER),
    "a decorated helper": (IN_EPOCHS + "    for i, b in ckpt_nb.batches(loader): pass\n"
                           "    evaluate(val_loader)\n", RESTORES, LATER),
    "a method of a class without source": (
        IN_EPOCHS + "    unread.train_epoch(loader)\n"
        "    for i, b in ckpt_nb.batches(val_loader): pass\n", EITHER, EITHER),
    "a partial": (IN_EPOCHS + "    run_partial(loader)\n", EITHER, WRAP),
    "an import as": ("from ckpt_nb import batches as B, epochs as E\nfor epoch in E(3):\n"
                     "    for i, b in B(loader): pass\n    for i, b in B(val_loader): pass\n",
                     RESTORES, LATER),
    "library calls first": (IN_EPOCHS + "    model.train()\n    with torch.no_grad():\n"
                            "        print(len(loader))\n"
                            "    for i, b in ckpt_nb.batches(loader): pass\n", RESTORES, WRAP),
}


@pytest.mark.parametrize("case", UNFOLLOWED)
def test_a_loader_reaching_code_the_reader_cannot_follow_is_said_in_general(case: str) -> None:
    """A loader passed through a subscript, a list loop, a method, a partial, a helper's
    helper, or batches() imported under another name, was told 'wrap it in
    ckpt_nb.batches()' though it was wrapped; a val loader after a helper's epoch was
    told 'restores its order'. Where the loader reaches code the reader cannot follow,
    or a call it cannot see into comes first, the general wording is said."""
    code, train, val = UNFOLLOWED[case]
    namespace = loaders()
    namespace.update(loaders={"train": namespace["loader"], "val": namespace["val_loader"]},
                     fit=fit, evaluate=evaluate, train_global=train_global, trainer=Trainer(),
                     unread=UNREAD(),
                     run_partial=functools.partial(run_epoch, log=True),
                     model=torch.nn.Linear(3, 2), torch=torch)
    skipped = discover(namespace, code=code).skipped
    assert (skipped["loader"], skipped["val_loader"]) == (train, val), skipped


@pytest.mark.parametrize("use", ["for xb, in loader:\n        pass",
                                 "n = len(loader.dataset)",
                                 "xs = [x for x in loader]"])
def test_a_loader_used_without_batches_is_told_to_wrap_it(use: str) -> None:
    """The most common slip, a training loop over the loader itself, was said 'batches()
    restores its order in the loop it tracks' (a plain `for` over it, or an attribute of
    it, counted as code the reader cannot follow)."""
    code = f"for epoch in ckpt_nb.epochs(2):\n    {use}\n"
    assert said(code)["loader"] == WRAP


def test_a_call_of_a_name_the_namespace_lacks_yet_is_not_taken_for_a_builtin() -> None:
    """A helper imported in the cell itself calls batches(val_loader) first: train's was
    said restored (an unknown name looked up in builtins gave None, whose type is of
    'builtins', a known library), and val_loader told to wrap it."""
    code = ("from myutils import warm\n"
            "for epoch in ckpt_nb.epochs(2):\n"
            "    warm(model, val_loader)\n"
            "    for xb, in ckpt_nb.batches(loader):\n"
            "        pass\n")
    assert said(code)["loader"] == EITHER


class AttrDict(dict):
    """A config whose attributes are its keys: reading any other raises KeyError."""

    __getattr__ = dict.__getitem__
    __setattr__ = dict.__setitem__


def test_a_namespace_value_that_raises_when_read_is_skipped_not_raised() -> None:
    """A dead weakref.proxy at the namespace's top made every %%ckpt_auto cell fail with
    a bare traceback. An AttrDict config (KeyError for load_state_dict) did too; asked of
    its class, it is skipped as a dict subclass, which would come back a plain dict."""
    class Owner:
        pass

    owner = Owner()
    proxy = weakref.proxy(owner)
    del owner
    skipped = said("for xb, in loader:\n    pass\n", {"cfg": AttrDict(lr=0.1), "gone": proxy})
    assert skipped["cfg"] == "AttrDict, a dict subclass: it would come back as a plain dict"
    assert skipped["gone"] == "ProxyType: not read (ReferenceError reading it)"
    assert skipped["loader"] == WRAP


class GrowingConfig(dict):  # (as a DotMap: a missing attribute is a new child, kept)
    def __getattr__(self, key: str) -> Any:
        if key.startswith("__"):
            raise AttributeError(key)
        return self.setdefault(key, GrowingConfig())


class KeyConfig(dict):  # (the copy-paste idiom: a missing attribute is a KeyError)
    __getattr__ = dict.__getitem__


class OwnState:  # (a class of its own with the methods: tracked as before)
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def test_discovery_asks_a_config_dicts_class_not_its_getattr() -> None:
    grown, keyed = GrowingConfig(lr=0.1), KeyConfig(epochs=2)
    found = discover({"dm": grown, "cfg": keyed, "model": torch.nn.Linear(2, 2),
                      "state": OwnState()})
    assert grown == {"lr": 0.1} and keyed == {"epochs": 2}  # (no key added)
    assert set(found.statefuls) == {"model", "state"}
    assert not found.variables and set(found.skipped) == {"dm", "cfg"}  # (dict subclasses)


class Delegating:  # (a wrapper of a model, forwarding what it lacks to it)
    def __init__(self, inner: torch.nn.Module) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_wrapper_forwarding_state_dict_by_getattr_is_still_tracked() -> None:
    """Asking the class alone (for a config dict's sake) left out a wrapper whose
    state_dict() is its model's, forwarded by __getattr__: skipped as 'Delegating', its
    model was in no checkpoint."""
    wrapped = Delegating(torch.nn.Linear(2, 2))
    found = discover({"model": wrapped, "cfg": GrowingConfig(lr=0.1)})
    assert set(found.statefuls) == {"model"} and set(found.skipped) == {"cfg"}


def test_a_zipped_loader_with_workers_drawing_from_an_inline_generator_is_not_said_restored(
        ) -> None:
    """``batches(zip(l1, l2))``, l1 with workers and its generator= written inline: zip()
    makes its iterator, which draws its order, before batches() can set that generator,
    and a resume says the order may differ; the start line said "ckpt_nb.batches()
    restores its order" all the same. Now it says what the resume says. A loader drawing
    from a notebook generator (put back before the zip is made), one without workers, and
    one in a wrapper in the zip (whose iterator is made in the loop) are restored."""
    data = torch.utils.data.TensorDataset(torch.randn(12, 3))
    g = torch.Generator()

    def loader(workers: int, generator: torch.Generator) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(data, shuffle=True, num_workers=workers,
                                           generator=generator)

    namespace = {"l1": loader(1, torch.Generator()), "l2": loader(1, g),
                 "l3": loader(0, torch.Generator()), "l4": loader(1, torch.Generator()),
                 "l5": loader(1, torch.Generator()), "g": g}
    skipped = discover(namespace, code="""
for epoch in ckpt_nb.epochs(2):
    for i, (a, b, c, d, e) in ckpt_nb.batches(zip(l1, l2, l3, tqdm(l4), iter(l5))):
        pass
""").skipped
    assert skipped["l1"] == (
        "DataLoader: in the zip() given to ckpt_nb.batches(), with workers, it draws its "
        "order as zip() makes its iterator, before batches() can set its generators: a "
        "resume may go on in another order; to resume it exactly, make its generator= a "
        "notebook variable (`g = torch.Generator().manual_seed(7)`, then `generator=g`)")
    assert skipped["l5"] == skipped["l1"]  # (iter(l5): made as zip()'s argument, as l1's)
    assert {skipped[n] for n in ("l2", "l3", "l4")} == {RESTORES}, skipped


def test_a_zipped_loader_with_persistent_workers_is_not_said_restored(capsys) -> None:
    """A loader with persistent workers in the zip given to batches(), itself or in a
    wrapper, its generator= a notebook variable: a resume makes its iterator anew, where a
    run never stopped kept it, and says the order may differ; the start line said
    "restores its order", and its warning "the order of its batches is the same"."""
    data = torch.utils.data.TensorDataset(torch.randn(12, 3))
    g = torch.Generator()
    namespace = {name: torch.utils.data.DataLoader(data, shuffle=True, num_workers=1,
                                                   persistent_workers=True, generator=g)
                 for name in ("l1", "l2")}
    namespace["g"] = g
    skipped = discover(namespace, code="""
for epoch in ckpt_nb.epochs(2):
    for i, (a, b) in ckpt_nb.batches(zip(l1, tqdm(l2))):
        pass
""").skipped
    assert skipped["l1"] == skipped["l2"] == (
        "DataLoader: in the zip() given to ckpt_nb.batches(), with persistent workers, its "
        "iterator is made anew by a resume, where a run never stopped kept it from the epoch "
        "before: a resume may go on in another order; persistent_workers=False (and a "
        "notebook variable for its generator=) resumes it exactly"), skipped
    warned = capsys.readouterr().err
    assert "l1's persistent workers keep a random state" in warned, warned
    assert "the order of its batches is the same" not in warned, warned


def test_a_loader_zipped_in_a_later_loop_only_is_said_as_its_first_loop_restores_it(
        capsys) -> None:
    """``batches(l1)`` first, then ``batches(zip(l1, l2))`` later in the epoch (a plain
    enumerate): the zip marks were taken from any loop, and l1, which the tracked first
    loop restores, was said to resume in another order (with workers, or persistent ones,
    whose warning lost "the order of its batches is the same"). The tracked loop's alone
    counts now."""
    data = torch.utils.data.TensorDataset(torch.randn(12, 3))
    g = torch.Generator()
    namespace = {"l1": torch.utils.data.DataLoader(data, shuffle=True, num_workers=1,
                                                   generator=torch.Generator()),
                 "l2": torch.utils.data.DataLoader(data, shuffle=True, num_workers=1,
                                                   persistent_workers=True, generator=g),
                 "l3": torch.utils.data.DataLoader(data, shuffle=True, generator=g), "g": g}
    skipped = discover(namespace, code="""
for epoch in ckpt_nb.epochs(2):
    for i, (a, b) in ckpt_nb.batches(zip(tqdm(l1), l3)):
        pass
    for i, b in ckpt_nb.batches(l2):
        pass
    for i, (a, b, c) in ckpt_nb.batches(zip(l1, l2, l3)):
        pass
""").skipped
    assert skipped["l1"] == skipped["l3"] == RESTORES, skipped
    assert skipped["l2"].startswith("DataLoader: passed to a later batches() loop"), skipped
    skipped = discover(namespace, code="""
for epoch in ckpt_nb.epochs(2):
    for i, b in ckpt_nb.batches(l2):
        pass
    for i, (a, b) in ckpt_nb.batches(zip(l2, l3)):
        pass
""").skipped
    assert skipped["l2"] == RESTORES, skipped
    warned = capsys.readouterr().err
    assert "l2's persistent workers" in warned and "batches is the same" in warned, warned
