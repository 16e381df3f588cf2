"""A streaming ``multipart/form-data`` reader for pushes: every file part goes straight into
the push's staging directory as its bytes arrive.

Starlette's form parser spools each file to the system temp directory first: a second
copy of a model of several GiB, on a filesystem that may be a RAM-backed tmpfs. Here the
python-multipart parser's callbacks queue each piece of a file part, and the reader feeds
them to a ``FileSink`` of the push's ``StagingBox`` (hashed and counted against the limit
on the way, written in a worker thread) before it parses the next block of the body;
text fields (version, labels, keep_fp32) are collected, each capped, as are their number
and part headers.

File fields: ``file`` (the graph, a tar, or any of the model's files) and ``data`` (an
external-data file), each under the file name the graph uses, repeatable; and
``calibration`` and ``eval`` (each an .npz) once each."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from central.errors import BadRequest
from central.registry.bundle import MAX_FILES, ReceivedPart
from central.registry.staging import CALIBRATION_FILE, EVAL_FILE, FileSink, StagedFile, StagingBox

MODEL_FIELDS = frozenset({"file", "data"})
#: The data files a push may carry besides the model, each once, by field: staged under these names.
SIDE_FILES = {"calibration": CALIBRATION_FILE, "eval": EVAL_FILE}
#: Text fields of one push (version, labels, keep_fp32, ...).
MAX_FIELDS = 64
MAX_FIELD_BYTES = 64 * 1024
#: Bytes of one part's headers (Content-Disposition, Content-Type).
MAX_HEADER_BYTES = 16 * 1024


@dataclass
class PushForm:
    """What a multipart push held: the model's staged parts, its data files and text fields."""

    parts: list[ReceivedPart] = field(default_factory=list)
    #: ``calibration`` and ``eval`` parts, by field name.
    side: dict[str, StagedFile] = field(default_factory=dict)
    fields: dict[str, list[str]] = field(default_factory=dict)

    @property
    def calibration(self) -> StagedFile | None:
        """The calibration .npz, if the push sent one."""
        return self.side.get("calibration")

    @property
    def eval_data(self) -> StagedFile | None:
        """The eval .npz (inputs plus a ``label`` array), if the push sent one."""
        return self.side.get("eval")

    def get(self, name: str) -> str | None:
        """The last value of a text field, or None."""
        values = self.fields.get(name)
        return values[-1] if values else None


def boundary_of(content_type: str) -> bytes:
    """The boundary of a multipart Content-Type; 400 when it has none."""
    _, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if not boundary:
        raise BadRequest("multipart push without a boundary in its Content-Type")
    return boundary


class _PushFormReader:
    """The parser's callbacks; one instance per request."""

    def __init__(self, box: StagingBox) -> None:
        self.box = box
        self.form = PushForm()
        self.ended = False
        self._headers: dict[str, str] = {}
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._header_bytes = 0
        self._sink: FileSink | None = None
        self._filename: str | None = None
        #: The side-file field the open sink belongs to; None for a model file.
        self._side: str | None = None
        self._field: str | None = None
        self._value = bytearray()
        self._files = 0
        self._sides_started: set[str] = set()
        #: What the callbacks of one ``parser.write`` found for file parts, in order:
        #: (sink, a piece of its bytes) or (sink, None) at its end, with where it goes.
        self._queued: list[tuple[FileSink, bytes | None, str | None, str | None]] = []
        self._open: list[FileSink] = []

    def callbacks(self) -> dict[str, object]:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": self._header_field,
            "on_header_value": self._header_value_data,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
            "on_end": self._end,
        }

    def _part_begin(self) -> None:
        self._headers, self._header_bytes = {}, 0
        self._header_name.clear()
        self._header_value.clear()

    def _count_header(self, n: int) -> None:
        self._header_bytes += n
        if self._header_bytes > MAX_HEADER_BYTES:
            raise BadRequest(f"a multipart part's headers exceed {MAX_HEADER_BYTES} bytes")

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self._header_name += data[start:end]

    def _header_value_data(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        self._headers[self._header_name.decode("latin-1").strip().lower()] = self._header_value.decode("latin-1")
        self._header_name.clear()
        self._header_value.clear()

    def _headers_finished(self) -> None:
        disposition, options = parse_options_header(self._headers.get("content-disposition"))
        if disposition != b"form-data" or b"name" not in options:
            raise BadRequest("a multipart part has no Content-Disposition: form-data with a name")
        name = _text(options[b"name"], "a field name")
        filename = _text(options[b"filename"], "a file name") if b"filename" in options else None
        if name in MODEL_FIELDS:
            self._files += 1
            if self._files > MAX_FILES:
                raise BadRequest(f"a push holds at most {MAX_FILES} files")
            self._sink, self._filename, self._side = self.box.sink(), filename, None
            self._open.append(self._sink)
        elif name in SIDE_FILES:
            if name in self._sides_started:
                raise BadRequest(f"a push takes one {name} file")
            self._sides_started.add(name)
            self._sink, self._filename, self._side = self.box.sink(SIDE_FILES[name]), None, name
            self._open.append(self._sink)
        elif filename is not None:
            raise BadRequest(f"unexpected file field {name!r}: send the model's files as 'file' or 'data'")
        else:
            if sum(len(v) for v in self.form.fields.values()) >= MAX_FIELDS:
                raise BadRequest(f"a push takes at most {MAX_FIELDS} form fields")
            self._field = name
            self._value.clear()

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._sink is not None:
            self._queued.append((self._sink, data[start:end], self._filename, self._side))
            return
        self._value += data[start:end]
        if len(self._value) > MAX_FIELD_BYTES:
            raise BadRequest(f"form field {self._field!r} exceeds {MAX_FIELD_BYTES} bytes")

    def _part_end(self) -> None:
        if self._sink is not None:
            self._queued.append((self._sink, None, self._filename, self._side))
            self._sink = None
        elif self._field is not None:
            value = _text(bytes(self._value), f"form field {self._field!r}")
            self.form.fields.setdefault(self._field, []).append(value)
            self._field = None

    def _end(self) -> None:
        self.ended = True

    async def drain(self) -> None:
        """Write what the callbacks queued; finish the parts that ended."""
        queued, self._queued = self._queued, []
        for sink, piece, filename, side in queued:
            if piece is not None:
                await sink.feed(piece)
                continue
            staged = await sink.finish()
            self._open.remove(sink)
            if side is not None:
                self.form.side[side] = staged
            else:
                self.form.parts.append(ReceivedPart(filename, staged))

    def abort(self) -> None:
        """Remove the files an error left half-written."""
        for sink in self._open:
            sink.abort()
        self._open.clear()


def _text(raw: bytes, what: str) -> str:
    """Header parameters and field values as text: clients send UTF-8 in them."""
    try:
        return raw.decode("utf-8")
    except UnicodeError:
        raise BadRequest(f"{what} is not valid UTF-8") from None


async def read_push_form(body: AsyncIterator[bytes], content_type: str, box: StagingBox) -> PushForm:
    """Parse a multipart push, staging every file part into ``box`` as it arrives."""
    reader = _PushFormReader(box)
    parser = MultipartParser(boundary_of(content_type), reader.callbacks())  # type: ignore[arg-type]
    try:
        async for block in body:
            parser.write(block)
            await reader.drain()
        parser.finalize()
        await reader.drain()
    except FormParserError as exc:
        reader.abort()
        raise BadRequest(f"malformed multipart body: {exc}") from exc
    except BaseException:
        reader.abort()
        raise
    if not reader.ended:
        reader.abort()
        raise BadRequest("the multipart body ended before its closing boundary")
    return reader.form
