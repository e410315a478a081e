"""The workspace paths no tool may read, list, search or write: the repository and credentials.

One list, the only one: the agent's jail hides and refuses these paths, and the controller's
write policy (``controller/tools/policy.py``) imports these very objects to refuse them in a diff,
so the two sides can never disagree. docs/architecture.md ("Protected paths") gives the
reason for each entry.

Every comparison is on the Unicode NFC, case-folded form, so ``.NPMRC`` and a decomposed
spelling of a name are the same name. A rule matches at any depth: ``sub/.npmrc`` is as
protected as ``.npmrc``, and everything beneath a protected directory is protected too.

Standard library only; imported by the agent (Python 3.9) and by the host controller.
"""

from __future__ import annotations

import unicodedata

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, FrozenSet, Tuple

# Whole component names (already folded).
NAMES: FrozenSet[str] = frozenset(
    {
        # The repository itself: history and hooks are never the model's to see or change.
        ".git",
        # Registry and login tokens in dotfiles.
        ".npmrc",
        ".pypirc",
        ".netrc",
        "_netrc",
        ".git-credentials",
        ".dockercfg",
        ".boto",
        ".s3cfg",
        ".vault-token",
        # Database and web passwords.
        ".pgpass",
        ".my.cnf",
        ".htpasswd",
        # Key directories: every file beneath is a key, a known host or an agent socket.
        ".ssh",
        ".gnupg",
        # Cloud credentials written under a fixed name.
        "credentials.json",
        "application_default_credentials.json",
        "credentials.tfrc.json",
    }
)

# Name beginnings: ``.env`` and its variants (``.env.local``, ``.envrc``, ``.envs/``), and
# SSH key files, private and public alike (``id_rsa``, ``id_rsa.pub``, ``id_ed25519_sk``):
# a public key is no secret, but one rule for the pair keeps listing and writing coherent.
PREFIXES: Tuple[str, ...] = (".env", "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519")

# Name endings: key and certificate stores, private keys, password databases, encrypted
# blobs and Terraform state (which holds every secret of the infrastructure in clear text).
SUFFIXES: Tuple[str, ...] = (
    ".pem",
    ".key",
    ".ppk",
    ".p12",
    ".pfx",
    ".jks",
    ".keystore",
    ".kdbx",
    ".gpg",
    ".tfstate",
    ".tfstate.backup",
)

# A name protected only inside a given directory: (directory, name). ``config.json`` alone
# is an everyday project file; ``.docker/config.json`` holds registry logins.
PAIRS: FrozenSet[Tuple[str, str]] = frozenset(
    {
        (".docker", "config.json"),
        (".aws", "credentials"),
        (".aws", "config"),
        (".kube", "config"),
        (".cargo", "credentials"),
        (".cargo", "credentials.toml"),
        (".gem", "credentials"),
        ("gh", "hosts.yml"),
    }
)


def fold(name: str) -> str:
    """The form every comparison uses: Unicode NFC, then case folding."""
    return unicodedata.normalize("NFC", name).casefold()


def is_protected_name(name: str) -> bool:
    """True when one path component is protected whatever its directory (folded here)."""
    f = fold(name)
    return f in NAMES or f.startswith(PREFIXES) or f.endswith(SUFFIXES)


def protected_in(folder: str) -> Callable[[str], bool]:
    """``is_protected_path`` for the names of one folder (``""``: the top), the folder's
    part checked once: ``protected_in(d)(n) == is_protected_path(d + "/" + n)``.

    For ASCII the folded form is ``lower()`` (NFC changes no ASCII text, case folding
    lowers it) and folds component by component, so a name then needs only its own test and
    its pair with the folder's last component. Anything else takes the whole-path test."""
    if not folder.isascii():
        return lambda name: is_protected_path(f"{folder}/{name}")
    if folder and is_protected_path(folder):
        return lambda _name: True
    last = folder.rsplit("/", 1)[-1].lower() if folder else None

    def check(name: str) -> bool:
        if not name.isascii():
            return is_protected_path(f"{folder}/{name}" if folder else name)
        f = name.lower()
        if f in NAMES or f.startswith(PREFIXES) or f.endswith(SUFFIXES):
            return True
        return last is not None and (last, f) in PAIRS

    return check


def is_protected_path(path: str) -> bool:
    """True when a relative ``/``-separated path is protected: one of its components is, or
    two adjacent components form a protected (directory, name) pair."""
    parts = fold(path).split("/")
    if any(p in NAMES or p.startswith(PREFIXES) or p.endswith(SUFFIXES) for p in parts):
        return True
    # An index loop, not itertools.pairwise: the agent runs on Python 3.9.
    return any((parts[i], parts[i + 1]) in PAIRS for i in range(len(parts) - 1))
