"""A conformance suite for ``Store`` backends, to run under pytest.

Subclass ``StoreConformance`` in a test module (name it ``Test...``) and give
it a ``store`` fixture that returns a fresh, empty store::

    import pytest
    from ckpt_nb.testing import StoreConformance

    class TestMyStore(StoreConformance):
        @pytest.fixture
        def store(self, tmp_path):
            return MyStore(tmp_path)

Every ``test_*`` method is then collected against that store. This module
imports pytest, a development dependency: import it from tests only.
"""

from __future__ import annotations

from typing import Any

import pytest

from ._store import Store

BAD_KEYS = ["", "../x", "a/../../x", "/abs", "a//b", "a/./b", "./a", "a/", "a b",
            "a\\b", "x.tmp-1234", "packs/p.pack.tmp-abc"]


class StoreConformance:
    """What every ``Store`` must do; subclasses supply the ``store`` fixture."""

    @pytest.fixture
    def store(self, tmp_path: Any) -> Store:
        raise NotImplementedError("a StoreConformance subclass must define a `store` fixture")

    def test_put_get(self, store: Store) -> None:
        store.put("a", b"hello")
        assert store.get("a") == b"hello"
        assert isinstance(store.get("a"), bytes)

    def test_ranged_get(self, store: Store) -> None:
        store.put("r", b"0123456789")
        assert store.get("r", 2, 5) == b"234"
        assert store.get("r", 7) == b"789"
        assert store.get("r", None, 3) == b"012"
        assert store.get("r", 0, 10) == b"0123456789"
        assert store.get("r", 4, 4) == b""
        assert store.get("r", 8, 100) == b"89"

    def test_has_and_size(self, store: Store) -> None:
        assert not store.has("k")
        store.put("k", b"12345")
        assert store.has("k")
        assert store.size("k") == 5

    def test_absent_keys(self, store: Store) -> None:
        with pytest.raises(FileNotFoundError):
            store.get("missing")
        with pytest.raises(FileNotFoundError):
            store.get("missing", 0, 1)
        with pytest.raises(FileNotFoundError):
            store.size("missing")
        with pytest.raises(FileNotFoundError):
            store.get("no/such/nested")

    def test_delete_is_idempotent(self, store: Store) -> None:
        store.put("d", b"x")
        store.delete("d")
        assert not store.has("d")
        store.delete("d")
        store.delete("never/was")
        with pytest.raises(FileNotFoundError):
            store.get("d")

    def test_list(self, store: Store) -> None:
        assert sorted(store.list()) == []
        keys = ["top", "packs/a.pack", "packs/b.pack", "packs/deep/c", "packsx/d", "m/e.json.zst"]
        for key in keys:
            store.put(key, key.encode())
        assert sorted(store.list()) == sorted(keys)
        assert sorted(store.list("")) == sorted(keys)
        assert sorted(store.list("packs")) == ["packs/a.pack", "packs/b.pack", "packs/deep/c"]
        assert sorted(store.list("packs/deep")) == ["packs/deep/c"]
        assert sorted(store.list("pack")) == []  # a folder, not a string prefix
        assert sorted(store.list("nothing")) == []
        store.delete("packs/a.pack")
        assert sorted(store.list("packs")) == ["packs/b.pack", "packs/deep/c"]

    def test_list_prefix_is_a_folder_not_a_value(self, store: Store) -> None:
        store.put("v", b"x")
        assert sorted(store.list("v")) == []

    def test_nested_keys(self, store: Store) -> None:
        store.put("a/b/c/d", b"deep")
        assert store.get("a/b/c/d") == b"deep"
        assert store.size("a/b/c/d") == 4
        assert store.has("a/b/c/d")
        assert not store.has("a/b")  # a folder is not a value

    def test_overwrite(self, store: Store) -> None:
        store.put("o", b"first value, longer")
        store.put("o", b"second")
        assert store.get("o") == b"second"
        assert store.size("o") == 6
        assert sorted(store.list()) == ["o"]

    def test_writer_streams_parts(self, store: Store) -> None:
        with store.writer("w") as out:
            out.write(b"ab")
            out.write(memoryview(b"cd"))
            out.write(b"")
            out.write(b"ef")
        assert store.get("w") == b"abcdef"

    def test_failed_writer_stores_nothing(self, store: Store) -> None:
        with pytest.raises(RuntimeError):
            with store.writer("new") as out:
                out.write(b"partial")
                raise RuntimeError("boom")
        assert not store.has("new")
        assert sorted(store.list()) == []

    def test_failed_writer_keeps_old_value(self, store: Store) -> None:
        store.put("k", b"old")
        with pytest.raises(KeyboardInterrupt):
            with store.writer("k") as out:
                out.write(b"new bytes")
                raise KeyboardInterrupt
        assert store.get("k") == b"old"
        assert sorted(store.list()) == ["k"]

    @pytest.mark.parametrize("key", BAD_KEYS)
    def test_invalid_keys(self, store: Store, key: str) -> None:
        for call in (lambda: store.put(key, b"x"), lambda: store.get(key),
                     lambda: store.has(key), lambda: store.size(key),
                     lambda: store.delete(key)):
            with pytest.raises(ValueError):
                call()
        assert sorted(store.list()) == []

    def test_binary_values(self, store: Store) -> None:
        data = bytes(range(256)) * 64 + b"\x00\r\n\x1a"
        store.put("bin", data)
        assert store.get("bin") == data
        assert store.size("bin") == len(data)
        big = bytes(range(251)) * 9000  # a couple of MiB, not a multiple of any buffer size
        store.put("big", big)
        assert store.get("big") == big
        assert store.get("big", 1_000_001, 1_000_011) == big[1_000_001:1_000_011]

    def test_read_into(self, store: Store) -> None:
        data = bytes(range(251)) * 40
        store.put("r", data)
        buf = bytearray(100)
        assert store.read_into("r", 1000, memoryview(buf)) == 100
        assert bytes(buf) == data[1000:1100]
        tail = bytearray(50)  # the value ends first: fewer bytes, the rest untouched
        assert store.read_into("r", len(data) - 20, memoryview(tail)) == 20
        assert bytes(tail[:20]) == data[-20:] and bytes(tail[20:]) == bytes(30)
        with pytest.raises(FileNotFoundError):
            store.read_into("missing", 0, memoryview(bytearray(4)))

    def test_view(self, store: Store) -> None:
        data = bytes(range(256)) * 64
        store.put("v", data)
        view = store.view("v")
        assert view is None or (view.readonly and view == data)
        store.put("v", b"new")  # an existing view keeps the old value
        assert view is None or view == data
        store.put("nothing", b"")
        assert store.view("nothing") in (None, b"")
        with pytest.raises(FileNotFoundError):
            store.view("missing")

    def test_prefetch_is_only_a_hint(self, store: Store) -> None:
        store.put("p", bytes(10_000))
        store.prefetch("p", [(0, 100), (50, 9_000), (20_000, 10)])  # past the end too
        store.prefetch("missing", [(0, 1)])
        assert store.get("p") == bytes(10_000)

    def test_empty_value(self, store: Store) -> None:
        store.put("empty", b"")
        assert store.has("empty")
        assert store.size("empty") == 0
        assert store.get("empty") == b""
        assert "empty" in set(store.list())

    def test_memoryview_input(self, store: Store) -> None:
        import array

        store.put("mv", memoryview(b"xxabcdxx")[2:6])
        assert store.get("mv") == b"abcd"
        words = array.array("I", [1, 2, 3])  # a view with itemsize 4
        store.put("words", memoryview(words))
        assert store.get("words") == words.tobytes()

    def test_url_and_repr(self, store: Store) -> None:
        assert isinstance(store.url, str) and store.url
        assert type(store).__name__ in repr(store)
