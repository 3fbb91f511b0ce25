"""Code-object cache: locations, manifest validation, integrity, atomic and concurrent writes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import platformdirs
import pytest

from zyfa_runtime import cache
from zyfa_runtime.errors import CodeObjectError, ZyfaError

REPO = Path(__file__).resolve().parent.parent


def _entry(name: str, data: bytes) -> dict:
    return {"file": name, "sha256": cache.sha256_hex(data)}


def _manifest(**over) -> dict:
    m = {"package_version": "0.1.0", "toolkits": {"sm_90a": "CUDA 13.0", "gfx950": "ROCm 7.2.3"},
         "compilers": {"sm_90a": "nvcc 13.0"}, "kernels": []}
    m.update(over)
    return m


# -- locations ----------------------------------------------------------------------------

def test_toolkit_slug():
    assert cache.toolkit_slug("CUDA 13.0") == "cuda-13.0"
    assert cache.toolkit_slug("ROCm 7.2.3") == "rocm-7.2.3"
    with pytest.raises(CodeObjectError):
        cache.toolkit_slug("  ")


def test_cache_dir_env_override(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    assert cache.cache_root() == tmp_path
    assert cache.user_cache_dir("0.1.0", "CUDA 13.0", "sm_90a") == tmp_path / "0.1.0" / "cuda-13.0" / "sm_90a"
    dirs = cache.search_dirs(_manifest(), "gfx950", prebuilt=tmp_path / "pre")
    assert dirs == [tmp_path / "pre", tmp_path / "0.1.0" / "rocm-7.2.3" / "gfx950"]


def test_cache_dir_default_is_platformdirs(monkeypatch):
    monkeypatch.delenv(cache.CACHE_ENV, raising=False)
    assert cache.cache_root() == Path(platformdirs.user_cache_dir("zyfa"))


def test_prebuilt_dir_env_override(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.PREBUILT_ENV, str(tmp_path))
    assert cache.prebuilt_dir() == tmp_path
    monkeypatch.delenv(cache.PREBUILT_ENV)
    assert cache.prebuilt_dir().name == "prebuilt"


def test_unsafe_names_refused(tmp_path):
    for name in ("../evil.cubin", "/abs.cubin", ""):
        with pytest.raises(CodeObjectError):
            cache.read_code_object({"file": name, "sha256": "0" * 64}, [tmp_path])
    with pytest.raises(CodeObjectError):
        cache.user_cache_dir("../x", "CUDA 13.0", "sm_90a")


# -- manifest -----------------------------------------------------------------------------

def test_manifest_loads(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(_manifest()))
    assert cache.load_manifest(tmp_path)["package_version"] == "0.1.0"


def test_manifest_from_env(tmp_path, monkeypatch):
    (tmp_path / "manifest.json").write_text(json.dumps(_manifest(package_version="9.9")))
    monkeypatch.setenv(cache.PREBUILT_ENV, str(tmp_path))
    assert cache.load_manifest()["package_version"] == "9.9"


@pytest.mark.parametrize("text, needle", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    (json.dumps({"package_version": "0.1.0", "toolkits": {}}), "compilers, kernels"),
    (json.dumps(_manifest(kernels="nope")), "'kernels'"),
])
def test_manifest_malformed_refused(tmp_path, text, needle):
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(CodeObjectError, match=needle):
        cache.load_manifest(tmp_path)


def test_manifest_missing_refused(tmp_path):
    with pytest.raises(CodeObjectError, match="no kernel manifest"):
        cache.load_manifest(tmp_path)


# -- integrity ----------------------------------------------------------------------------

def test_read_verified(tmp_path):
    data = os.urandom(4096)
    cache.store_code_object(tmp_path, "sm_90a/k.cubin", data, cache.sha256_hex(data))
    assert cache.read_code_object(_entry("sm_90a/k.cubin", data), [tmp_path]) == data


def test_tampered_file_refused(tmp_path):
    data = os.urandom(4096)
    entry = _entry("k.cubin", data)
    path = cache.store_code_object(tmp_path, "k.cubin", data, entry["sha256"])
    flipped = bytearray(data)
    flipped[1234] ^= 0x01
    path.write_bytes(bytes(flipped))
    with pytest.raises(CodeObjectError) as info:
        cache.read_code_object(entry, [tmp_path])
    msg = str(info.value)
    assert "k.cubin" in msg and entry["sha256"] in msg and cache.sha256_hex(bytes(flipped)) in msg
    assert isinstance(info.value, ZyfaError)


def test_tampered_copy_skipped_for_a_good_one(tmp_path):
    data = os.urandom(512)
    entry = _entry("k.hsaco", data)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "k.hsaco").write_bytes(b"x" + data[1:])
    cache.store_code_object(tmp_path / "b", "k.hsaco", data, entry["sha256"])
    assert cache.read_code_object(entry, [tmp_path / "a", tmp_path / "b"]) == data


def test_missing_file_refused(tmp_path):
    entry = _entry("absent.cubin", b"abc")
    with pytest.raises(CodeObjectError, match="absent.cubin.*missing") as info:
        cache.read_code_object(entry, [tmp_path, tmp_path / "other"])
    assert entry["sha256"] in str(info.value)


def test_bad_digest_in_entry_refused(tmp_path):
    (tmp_path / "k.cubin").write_bytes(b"abc")
    with pytest.raises(CodeObjectError, match="sha256"):
        cache.read_code_object({"file": "k.cubin", "sha256": "xyz"}, [tmp_path])
    with pytest.raises(CodeObjectError, match="names no file"):
        cache.read_code_object({"sha256": "0" * 64}, [tmp_path])


def test_store_refuses_wrong_digest(tmp_path):
    with pytest.raises(CodeObjectError, match="refusing"):
        cache.store_code_object(tmp_path, "k.cubin", b"abc", cache.sha256_hex(b"abd"))
    assert not (tmp_path / "k.cubin").exists()


# -- atomic writes ------------------------------------------------------------------------

def _leftovers(directory: Path) -> list[str]:
    return [p.name for p in directory.rglob("*") if p.name.endswith(".tmp")]


def test_atomic_write_leaves_no_temp_files(tmp_path):
    target = tmp_path / "sub" / "k.cubin"
    for i in range(20):
        cache.atomic_write(target, bytes([i]) * 1000)
    assert target.read_bytes() == bytes([19]) * 1000
    assert _leftovers(tmp_path) == []


def test_atomic_write_failure_cleans_up_and_keeps_old(tmp_path, monkeypatch):
    target = tmp_path / "k.cubin"
    cache.atomic_write(target, b"old")

    def boom(*a, **k):
        raise OSError("disk on fire")
    monkeypatch.setattr(cache.os, "replace", boom)
    with pytest.raises(OSError, match="disk on fire"):
        cache.atomic_write(target, b"new" * 1000)
    assert target.read_bytes() == b"old"
    assert _leftovers(tmp_path) == []


def test_atomic_write_never_exposes_partial_content(tmp_path):
    target = tmp_path / "k.cubin"
    a, b = b"a" * (1 << 20), b"b" * (1 << 19)
    cache.atomic_write(target, a)
    stop, bad = threading.Event(), []

    def reader():
        while not stop.is_set():
            got = target.read_bytes()
            if got not in (a, b):
                bad.append(len(got))

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(200):
            cache.atomic_write(target, b if i % 2 == 0 else a)
    finally:
        stop.set()
        t.join()
    assert bad == []
    assert _leftovers(tmp_path) == []


# -- concurrent processes -----------------------------------------------------------------

WORKER = textwrap.dedent("""
    import hashlib, os, sys, time
    from pathlib import Path
    from zyfa_runtime import cache

    cache_dir, go, me, iters = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    shared = [(f"shared{i}.cubin", hashlib.sha256(b"seed%d" % i).digest() * (2000 + 7 * i))
              for i in range(3)]
    own = (f"own{me}.hsaco", bytes([me]) * 300_000)
    deadline = time.time() + 60
    while not go.exists():
        if time.time() > deadline:
            sys.exit("never started")
        time.sleep(0.001)
    for it in range(iters):
        for name, data in shared + [own]:
            if it % 3 == 0:
                # Exercise the publish path every time, not only the "already there" shortcut.
                cache.atomic_write(cache_dir / name, data)
            else:
                cache.store_code_object(cache_dir, name, data, cache.sha256_hex(data))
            got = cache.read_code_object({"file": name, "sha256": cache.sha256_hex(data)},
                                         [cache_dir])
            assert got == data, name
    print("ok")
""")


def test_concurrent_processes_store_and_read(tmp_path):
    cache_dir, go = tmp_path / "cache", tmp_path / "go"
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, str(script), str(cache_dir), str(go), str(i), "40"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(8)]
    go.touch()
    results = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err
        assert out.strip() == "ok"
    for i in range(3):
        data = hashlib.sha256(b"seed%d" % i).digest() * (2000 + 7 * i)
        assert cache.read_code_object(_entry(f"shared{i}.cubin", data), [cache_dir]) == data
    for me in range(8):
        data = bytes([me]) * 300_000
        assert cache.read_code_object(_entry(f"own{me}.hsaco", data), [cache_dir]) == data
    assert _leftovers(cache_dir) == []
