"""FileService's method bodies: files in and out of a run's workspace (ringfence_server/control/files.py).

UploadFiles is a client stream: the first message names the run and the destination (checked
before anything else is read), every message carries the next bytes of one uncompressed tar.
The bytes are counted as they arrive and the stream is RESOURCE_EXHAUSTED past
files.max_upload_bytes (nothing is copied); the whole archive is then handed to the core, which
checks every member before anything reaches the workspace. DownloadFiles answers each file as
chunks of CHUNK_BYTES in path order; the last chunk of a file carries its size and sha256, and a
link in the workspace comes as one chunk with `skipped` and no data.

Both hold one of the tenant's transfer slots (EdgeOptions.max_transfers) while the archive or
the files are in memory here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

from ringfence.errors import FieldViolation, InvalidArgument, ResourceExhausted
from ringfence.v1 import files_pb2
from ringfence.wire import convert
from ringfence_server.control.files import DownloadedFile, FileInfo, path_problem

if TYPE_CHECKING:
    from ringfence_server.control.api.core import Core
    from ringfence_server.control.api.servicer import Call, Edge

__all__ = ["CHUNK_BYTES", "FileMethods", "file_chunks", "file_entry"]

CHUNK_BYTES = 256 * 1024
"""Data per FileChunk: well under grpc's default 4 MiB message cap on the client."""


def file_entry(f: FileInfo) -> files_pb2.FileEntry:
    return files_pb2.FileEntry(path=f.path, size=f.size, sha256=f.sha256)


def file_chunks(f: DownloadedFile) -> Iterator[files_pb2.FileChunk]:
    """One file as FileChunks: its data in CHUNK_BYTES pieces (an empty file is one chunk), the
    last with eof, size and sha256; a skipped entry is one chunk with `skipped` and no data."""
    if f.data is None:
        yield files_pb2.FileChunk(path=f.path, eof=True, skipped=f.skipped or "not delivered")
        return
    view = memoryview(f.data)
    offset = 0
    while True:
        piece = bytes(view[offset:offset + CHUNK_BYTES])
        offset += len(piece)
        if offset >= len(view):
            yield files_pb2.FileChunk(path=f.path, data=piece, eof=True, size=f.size, sha256=f.sha256)
            return
        yield files_pb2.FileChunk(path=f.path, data=piece)


class FileMethods:
    """FileService: UploadFiles (client stream) and DownloadFiles (server stream)."""

    def __init__(self, edge: Edge) -> None:
        self.edge = edge

    @property
    def core(self) -> Core:
        return self.edge.orchestrator

    async def UploadFiles(self, requests: AsyncIterator[files_pb2.UploadFilesRequest],
                          call: Call) -> files_pb2.UploadFilesResponse:
        cap = self.edge.options.max_upload_bytes
        slot = self.edge.transfers.acquire(call.principal.tenant)
        handed_over = False
        try:
            run_id: str | None = None
            dest = ""
            chunks: list[bytes] = []
            total = 0
            async for message in requests:
                if run_id is None:
                    run_id, dest = message.run_id, message.dest
                    v = convert.Violations()
                    convert.check_id(run_id, "run_id", v)
                    problem = path_problem(dest, allow_root=True)
                    if problem is not None:
                        v.add("dest", problem)
                    v.raise_if_any("the upload is invalid; nothing was copied")
                    # Another tenant's run, or none: NOT_FOUND now, not after the whole archive.
                    await call.run(self.core.get_run, call.principal, run_id)
                elif message.run_id or message.dest:
                    name = "run_id" if message.run_id else "dest"
                    raise InvalidArgument("the upload is invalid; nothing was copied", [FieldViolation(
                        name, "only the first message of the stream names the run and the destination")])
                total += len(message.tar_chunk)
                if total > cap:
                    raise ResourceExhausted(f"the archive is over files.max_upload_bytes ({cap} bytes); "
                                            "nothing was copied")
                chunks.append(message.tar_chunk)
            if run_id is None:
                raise InvalidArgument("the upload stream was empty; nothing was copied",
                                      [FieldViolation("run_id", "is required (on the first message)")])
            tar = b"".join(chunks)
            chunks.clear()
            handed_over = True  # from here the slot is released when the core call really ends
            files, seq = await call.run(self.core.upload_files, call.principal, run_id, dest, tar, slot=slot)
        finally:
            if not handed_over:
                slot()
        return files_pb2.UploadFilesResponse(files=[file_entry(f) for f in files], seq=seq)

    async def DownloadFiles(self, request: files_pb2.DownloadFilesRequest,
                            call: Call) -> AsyncIterator[files_pb2.FileChunk]:
        v = convert.Violations()
        convert.check_id(request.run_id, "run_id", v)
        max_files = self.edge.options.max_files
        if len(request.paths) > max_files:
            v.add("paths", f"{len(request.paths)} paths; at most {max_files}")
        else:
            for i, path in enumerate(request.paths):
                problem = path_problem(path)
                if problem is not None:
                    v.add(f"paths[{i}]", problem)
        v.raise_if_any()
        slot = self.edge.transfers.acquire(call.principal.tenant)
        files = await call.run(self.core.download_files, call.principal, request.run_id, list(request.paths),
                               request.artifacts, slot=slot)
        for f in files:
            for chunk in file_chunks(f):
                yield chunk
