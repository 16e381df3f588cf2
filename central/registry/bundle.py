"""Which staged file of a push is the graph, and what each of the others is called.

A push arrives as one body (a self-contained ``.onnx``, or a tar, plain or gzipped, of a
directory holding one ``.onnx`` and its external-data files) or as a multipart of several
files, each by its name. The parts are staged under temp names as they arrive; ``arrange``
then extracts a tar (streaming, member by member), picks the graph (the one file whose
name ends in ``.onnx``, or the only file), names it ``model.onnx`` and names every other
file as uploaded. A name that is not a plain file name, two graphs, or a tar entry that is
a link, a device, absolute, outside its directory or in a subdirectory is the uploader's
mistake: 400, and the caller discards the whole staging directory. Whether the graph
references exactly the data files that came with it is the validate step's job."""

from __future__ import annotations

import gzip
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from central.errors import BadRequest
from central.registry.staging import GRAPH_FILE, StagedFile, StagedUpload, StagingBox
from fleetwire.manifest import FILE_NAME

#: Most files one push may hold (a graph saved with one data file per tensor has hundreds).
MAX_FILES = 10_000
#: tarfile stream mode joins and slices what it decompresses: a few times this at a time.
_COPY_BLOCK = 256 * 1024
_GZIP_MAGIC = b"\x1f\x8b"
_KINDS = {
    tarfile.SYMTYPE: "symbolic link",
    tarfile.LNKTYPE: "hard link",
    tarfile.CHRTYPE: "character device",
    tarfile.BLKTYPE: "block device",
    tarfile.FIFOTYPE: "FIFO",
}


@dataclass(frozen=True)
class ReceivedPart:
    """One staged file of a push and the name it was uploaded under (None: a raw body)."""

    filename: str | None
    staged: StagedFile


def is_tar(path: Path) -> bool:
    """Whether a staged file is a tar (gzip magic, or the ustar magic of a tar header).

    No ONNX file matches either: a protobuf cannot start with 0x1f (wire type 7 does not
    exist), and a graph is not a tar header block with ``ustar`` at offset 257."""
    with path.open("rb") as f:
        head = f.read(512)
    return head.startswith(_GZIP_MAGIC) or head[257:262] == b"ustar"


def arrange(box: StagingBox, parts: list[ReceivedPart]) -> StagedUpload:
    """Turn the staged parts of a push into its ``StagedUpload`` (see the module docstring)."""
    if not parts:
        raise BadRequest("the push holds no model file")
    if len(parts) == 1 and is_tar(parts[0].staged.path):
        parts = extract_tar(box, parts[0].staged.path)
    graph, data = _roles(parts)
    if graph.staged.size == 0:
        raise BadRequest("the upload is empty" if len(parts) == 1 else f"the graph {graph.filename!r} is empty")
    files = {name: _rename(part.staged, box.directory / name) for name, part in data.items()}
    return StagedUpload(box.directory, _rename(graph.staged, box.directory / GRAPH_FILE), files)


def _rename(staged: StagedFile, target: Path) -> StagedFile:
    staged.path.rename(target)
    return StagedFile(target, staged.sha256, staged.size)


def _roles(parts: list[ReceivedPart]) -> tuple[ReceivedPart, dict[str, ReceivedPart]]:
    """(the graph, the data files by name)."""
    graphs = [p for p in parts if p.filename and p.filename.lower().endswith(".onnx")]
    if len(graphs) > 1:
        names = ", ".join(sorted(repr(p.filename) for p in graphs))
        raise BadRequest(f"the upload holds {len(graphs)} .onnx files ({names}); a version is one graph and its data")
    if graphs:
        graph = graphs[0]
    elif len(parts) == 1:
        graph = parts[0]
    else:
        raise BadRequest("a push of several files needs exactly one whose name ends in .onnx (the graph)")
    data: dict[str, ReceivedPart] = {}
    for part in parts:
        if part is graph:
            continue
        name = check_data_name(part.filename or "")
        if name in data:
            raise BadRequest(f"the upload holds two files named {name!r}")
        data[name] = part
    return graph, data


def check_data_name(name: str) -> str:
    """``name`` if it can be an external-data file next to the graph, else 400."""
    if not name:
        raise BadRequest("a data file came without a file name; send each one under the name the graph uses")
    if "/" in name or "\\" in name or name in (".", ".."):
        raise BadRequest(f"data file name {name!r} is not a plain file name: external data must sit next to the .onnx")
    if not FILE_NAME.fullmatch(name) or ".." in name:
        raise BadRequest(
            f"data file name {name!r} may only use letters, digits, '.', '_' and '-', must not start with a dot"
            " and is at most 200 characters"
        )
    return name


def extract_tar(box: StagingBox, tar_path: Path) -> list[ReceivedPart]:
    """Extract a staged tar (plain or compressed) into ``box``, member by member, streaming;
    the tar itself is removed. 400 on an entry that is not a plain file of one directory."""
    parts: list[ReceivedPart] = []
    directory: list[str] = []
    try:
        with tar_path.open("rb") as raw, tarfile.open(fileobj=raw, mode="r|*") as tar:
            for member in tar:
                name = _member_path(member, directory)
                if name is None:
                    continue
                if len(parts) >= MAX_FILES:
                    raise BadRequest(f"the tar holds more than {MAX_FILES} files")
                parts.append(ReceivedPart(name, _copy_member(box, tar, member)))
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise BadRequest(f"not a readable tar: {type(exc).__name__}: {exc}") from exc
    finally:
        tar_path.unlink(missing_ok=True)
    if not parts:
        raise BadRequest("the tar holds no file")
    return parts


def _member_path(member: tarfile.TarInfo, directory: list[str]) -> str | None:
    """The file name of a regular member (None for a directory entry); 400 for anything else.
    ``directory`` holds the one directory the tar's files may be in, once one is seen."""
    path = PurePosixPath(member.name)
    if path.is_absolute() or member.name.startswith("/"):
        raise BadRequest(f"tar entry {member.name!r} has an absolute path")
    if ".." in path.parts:
        raise BadRequest(f"tar entry {member.name!r} points outside its directory ('..')")
    if not member.isdir() and not member.isreg():
        kind = _KINDS.get(member.type, f"special entry (type {member.type!r})")
        raise BadRequest(f"tar entry {member.name!r} is a {kind}; a model's tar holds regular files only")
    parents = path.parts if member.isdir() else path.parts[:-1]
    if len(parents) > 1:
        raise BadRequest(
            f"tar entry {member.name!r} is in a subdirectory: the tar holds one directory with the .onnx"
            " and its data files side by side"
        )
    if parents:
        if directory and directory[0] != parents[0]:
            raise BadRequest(
                f"the tar's files are in more than one directory ({directory[0]!r}, {parents[0]!r});"
                " it must hold one model"
            )
        directory[:] = [parents[0]]
    if member.isdir():
        return None
    if not path.parts:
        raise BadRequest(f"tar entry {member.name!r} has no file name")
    return path.parts[-1]


def _copy_member(box: StagingBox, tar: tarfile.TarFile, member: tarfile.TarInfo) -> StagedFile:
    source = tar.extractfile(member)
    if source is None:  # isreg() members always have one; kept for the type checker
        raise BadRequest(f"tar entry {member.name!r} cannot be read")
    sink = box.sink(expected=member.size)
    try:
        while block := source.read(_COPY_BLOCK):
            sink.write(block)
        return sink.close()
    except BaseException:
        sink.abort()
        raise
