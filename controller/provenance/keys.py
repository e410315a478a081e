"""The host's signing key: an Ed25519 or ECDSA P-256 private key in a PKCS#8 PEM file that
only its owner can read (mode 0600), made by :func:`init_key` under ``$PATCHBOX_HOME/keys``
or named by the host configuration's ``provenance.key``. Signing goes through
securesystemslib's ``CryptoSigner``; the public key is written beside the private one
(``.pub``, PEM) and can be given to anyone who verifies."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from controller.errors import ErrorCode, PatchboxError
from controller.paths import patchbox_home

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519
    from securesystemslib.signer import CryptoSigner, SSlibKey

    PrivateKey = ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey

Scheme = Literal["ed25519", "ecdsa-p256"]
MAX_KEY_BYTES = 64 * 1024


def default_key_path() -> Path:
    """Where :func:`init_key` puts the key unless told otherwise."""
    return patchbox_home() / "keys" / "provenance.key"


def public_path(key: Path) -> Path:
    """The public key's file beside the private key's."""
    return key.with_name(key.name.removesuffix(".key") + ".pub")


def _key_error(code: ErrorCode, message: str) -> PatchboxError:
    return PatchboxError(message, code=code)


def init_key(path: Path | None = None, *, scheme: Scheme = "ed25519", force: bool = False) -> Path:
    """Makes a new private key at ``path`` (mode 0600, its folder 0700) and its public key
    beside it; ``SIGNING_KEY_EXISTS`` when one is there and ``force`` is not given. Returns
    the private key's path."""
    target = path or default_key_path()
    if target.exists() and not force:
        msg = f"a signing key already exists at {str(target)!r}; it is kept"
        raise _key_error(ErrorCode.SIGNING_KEY_EXISTS, msg)
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    from securesystemslib.signer import CryptoSigner  # loaded only where keys are used

    signer = (
        CryptoSigner.generate_ed25519() if scheme == "ed25519" else CryptoSigner.generate_ecdsa()
    )
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(signer.private_bytes)
            out.flush()
            os.fsync(out.fileno())
        if force:
            tmp.replace(target)
        else:  # a link fails if a key appeared meanwhile (another process made one): kept
            try:
                os.link(tmp, target)
            except FileExistsError:
                msg = f"a signing key already exists at {str(target)!r}; it is kept"
                raise _key_error(ErrorCode.SIGNING_KEY_EXISTS, msg) from None
    finally:
        tmp.unlink(missing_ok=True)
    public_path(target).write_text(public_pem(target))
    return target


def load_signer(path: Path) -> CryptoSigner:
    """The signer of the private key at ``path`` (:func:`load_private`)."""
    from securesystemslib.signer import CryptoSigner  # loaded only where keys are used

    return CryptoSigner(load_private(path))


def load_private(path: Path) -> PrivateKey:
    """The private key at ``path``: ``SIGNING_KEY_MISSING`` when there is no file,
    ``SIGNING_KEY_INVALID`` when others may read it, or it is not an unencrypted Ed25519 or
    ECDSA P-256 PEM key."""
    # the cryptography library is loaded only where a key is read (a job that signs
    # nothing never loads it)
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        info = path.stat()
    except FileNotFoundError as exc:
        msg = f"no signing key at {str(path)!r}"
        raise _key_error(ErrorCode.SIGNING_KEY_MISSING, msg) from exc
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_KEY_BYTES:
        msg = f"the signing key {str(path)!r} is not a key file"
        raise _key_error(ErrorCode.SIGNING_KEY_INVALID, msg)
    if info.st_mode & 0o077:
        msg = (
            f"the signing key {str(path)!r} may be read by others "
            f"(mode {stat.S_IMODE(info.st_mode):04o}); make it 0600"
        )
        raise _key_error(ErrorCode.SIGNING_KEY_INVALID, msg)
    try:
        key = load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm, OSError) as exc:
        msg = f"the signing key {str(path)!r} is not an unencrypted PEM private key"
        raise _key_error(ErrorCode.SIGNING_KEY_INVALID, msg) from exc
    if not isinstance(key, ed25519.Ed25519PrivateKey) and not (
        isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP256R1)
    ):
        msg = f"the signing key {str(path)!r} is neither Ed25519 nor ECDSA P-256"
        raise _key_error(ErrorCode.SIGNING_KEY_INVALID, msg)
    return key


def load_public(path: Path) -> SSlibKey:
    """The public key in the PEM file at ``path`` (``VERIFY_INPUT_INVALID`` otherwise)."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        data = path.read_bytes()
    except OSError as exc:
        msg = f"the public key {str(path)!r} cannot be read: {exc.strerror}"
        raise _key_error(ErrorCode.VERIFY_INPUT_INVALID, msg) from exc
    try:
        key = load_pem_public_key(data[:MAX_KEY_BYTES])
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        msg = f"{str(path)!r} is not a PEM public key"
        raise _key_error(ErrorCode.VERIFY_INPUT_INVALID, msg) from exc
    if not isinstance(key, ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey):
        msg = f"the public key {str(path)!r} is neither Ed25519 nor ECDSA"
        raise _key_error(ErrorCode.VERIFY_INPUT_INVALID, msg)
    from securesystemslib.signer import SSlibKey  # loaded only where keys are used

    return SSlibKey.from_crypto(key)


def public_pem(path: Path) -> str:
    """The public key of the private key at ``path``, as a PEM ``PUBLIC KEY`` block."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    public = load_private(path).public_key()
    return public.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()
