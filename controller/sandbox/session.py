"""Request/response over a Channel, with everything from the container decoded strictly."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterable

from pydantic import ValidationError

from controller.errors import ErrorCode, ProtocolError, SandboxError, ToolError
from controller.sandbox.base import Channel, HelloResult
from controller.sandbox.protocol import (
    BINARY_CHUNK,
    HEADER_SIZE,
    KIND_BINARY,
    KIND_SIGNED,
    MAX_RESPONSE_FRAME,
    PROTOCOL_VERSION,
    CallArgs,
    FrameVerifier,
    decode_json,
    encode,
    encode_request,
    parse_header,
)

_AGENT_ERROR_CODES = frozenset(
    {
        ErrorCode.TOOL_ARGUMENTS_INVALID,
        ErrorCode.TOOL_PATH_DENIED,
        ErrorCode.TOOL_PATH_INVALID,
        ErrorCode.TOOL_FILE_NOT_FOUND,
        ErrorCode.PATCH_REJECTED,
        ErrorCode.SANDBOX_FAILED,
    }
)
MAX_ERROR_MESSAGE = 1024


class AgentSession:
    """One conversation with one agent.

    Calls are serialised; ``cancel`` may be sent from another thread while a call waits.
    Any protocol violation raises ProtocolError and poisons the session: the sandbox must
    then be discarded.
    """

    def __init__(self, channel: Channel, max_frame: int = MAX_RESPONSE_FRAME) -> None:
        self._channel = channel
        self._max_frame = max_frame
        self._buf = bytearray()
        self._next_id = 1
        self._call_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._ignored: set[int] = set()
        self._broken: str | None = None
        self._key = secrets.token_bytes(32)
        self._verifier = FrameVerifier(self._key)

    @property
    def broken(self) -> str | None:
        return self._broken

    def poison(self, reason: str) -> None:
        """Marks the session unusable (after a protocol violation found by a caller)."""
        self._broken = self._broken or reason

    # -- frames ---------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        with self._send_lock:
            try:
                self._channel.sendall(data)
            except OSError as exc:
                raise SandboxError("the sandbox channel is closed") from exc

    def _fill(self, n: int, deadline: float) -> None:
        while len(self._buf) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ProtocolError("the sandbox did not answer in time")
            try:
                chunk = self._channel.recv(remaining)
            except TimeoutError as exc:
                raise ProtocolError("the sandbox did not answer in time") from exc
            except OSError as exc:
                raise SandboxError("the sandbox channel failed") from exc
            if not chunk:
                raise SandboxError("the sandbox closed the channel")
            self._buf += chunk

    def _read_frame(self, deadline: float) -> dict[str, object]:
        self._fill(HEADER_SIZE, deadline)
        kind, length = parse_header(bytes(self._buf[:HEADER_SIZE]), self._max_frame)
        if kind != KIND_SIGNED:
            raise ProtocolError("unexpected unsigned or binary frame from the sandbox")
        self._fill(HEADER_SIZE + length, deadline)
        payload = bytes(self._buf[HEADER_SIZE : HEADER_SIZE + length])
        del self._buf[: HEADER_SIZE + length]
        return decode_json(self._verifier.open(payload))

    def _take_id(self) -> int:
        rid = self._next_id
        self._next_id += 1
        return rid

    # -- calls ----------------------------------------------------------------------------

    def call(
        self,
        op: str,
        args: CallArgs,
        timeout: float,
        binary: bytes | Iterable[bytes] | None = None,
    ) -> dict[str, object]:
        """Sends one request and returns its result object, as the agent sent it (the
        caller validates it).

        Raises ToolError for an error the agent reports (data, retryable or not), and
        ProtocolError / SandboxError when the channel itself fails.
        """
        if self._broken is not None:
            raise SandboxError(f"the sandbox session is unusable: {self._broken}")
        deadline = time.monotonic() + timeout
        with self._call_lock:
            try:
                return self._call(op, args, deadline, binary)
            except SandboxError as exc:
                self._broken = exc.message
                raise

    def _call(
        self,
        op: str,
        args: CallArgs,
        deadline: float,
        binary: bytes | Iterable[bytes] | None,
    ) -> dict[str, object]:
        rid = self._take_id()
        data = encode_request(rid, op, args)
        if isinstance(binary, bytes):
            view = memoryview(binary)
            chunks = [
                encode(KIND_BINARY, bytes(view[i : i + BINARY_CHUNK]))
                for i in range(0, len(view), BINARY_CHUNK)
            ]
            data = b"".join([data, *chunks])
            self._send(data)
        elif binary is not None:
            self._send(data)
            self._send_stream(binary)
        else:
            self._send(data)
        while True:
            frame = self._read_frame(deadline)
            fid = frame.get("id")
            if isinstance(fid, int) and fid in self._ignored:
                self._ignored.discard(fid)
                continue
            if fid != rid:
                raise ProtocolError("a response from the sandbox has an unexpected id")
            return _unwrap(frame)

    def _send_stream(self, chunks: Iterable[bytes]) -> None:
        """Binary frames as the producer yields them, then an empty frame. A producer that
        fails leaves the agent mid-stream: the session is then unusable."""
        try:
            for chunk in chunks:
                view = memoryview(chunk)
                for i in range(0, len(view), BINARY_CHUNK):
                    self._send(encode(KIND_BINARY, bytes(view[i : i + BINARY_CHUNK])))
        except BaseException:
            self.poison("a binary stream to the sandbox was cut off")
            raise
        self._send(encode(KIND_BINARY, b""))

    def cancel(self, target: int) -> None:
        """Asks the agent to kill the process of call ``target``; does not wait."""
        with self._send_lock:
            rid = self._take_id()
            self._ignored.add(rid)
            try:
                self._channel.sendall(encode_request(rid, "cancel", {"target": target}))
            except OSError as exc:
                raise SandboxError("the sandbox channel is closed") from exc

    @property
    def next_id(self) -> int:
        return self._next_id

    def hello(self, timeout: float, protected: tuple[str, ...] = ()) -> HelloResult:
        args: CallArgs = {
            "protocol": PROTOCOL_VERSION,
            "key": self._key.hex(),
            "protected": list(protected),
        }
        result = self.call("hello", args, timeout)
        try:
            hello = HelloResult.model_validate(result)
        except ValidationError as exc:
            self.poison("malformed handshake")
            raise ProtocolError("the agent's handshake is malformed") from exc
        if hello.protocol != PROTOCOL_VERSION:
            raise ProtocolError("the agent speaks another protocol version")
        return hello


def _unwrap(frame: dict[str, object]) -> dict[str, object]:
    ok = frame.get("ok")
    result = frame.get("result")
    if ok is True and set(frame) == {"id", "ok", "result"} and isinstance(result, dict):
        return result
    if ok is False and set(frame) == {"id", "ok", "error"}:
        error = frame["error"]
        if (
            isinstance(error, dict)
            and set(error) == {"code", "message"}
            and error["code"] in _AGENT_ERROR_CODES
            and isinstance(error["message"], str)
            and len(error["message"]) <= MAX_ERROR_MESSAGE
        ):
            code = ErrorCode(error["code"])
            if code is ErrorCode.SANDBOX_FAILED:
                raise SandboxError(f"the agent failed: {error['message']}")
            raise ToolError(error["message"], code=code)
    raise ProtocolError("a response from the sandbox is malformed")
