"""The per-folder form of the protected-path test (what the agent's change detection and
listing use for every file) answers exactly as the whole-path test, for every rule, in
every case spelling, at every depth, ASCII or not."""

from __future__ import annotations

import itertools

from patchbox_agent.protected import NAMES, PAIRS, PREFIXES, SUFFIXES, protected_in
from patchbox_agent.protected import is_protected_path as whole

ORDINARY = ["src", "a", "config.json", "credentials", "gh", "hosts.yml", "env", "key", "x.pe"]
NON_ASCII = [
    "\u00c9t\u00e9",  # composed
    "E\u0301te\u0301",  # the same, decomposed
    ".\uff25\uff2e\uff36",  # fullwidth .ENV: NFC keeps it, so not .env
    "\ufb01le",  # the fi ligature, which case folding turns into "fi"
    "\u212a.key",  # the Kelvin sign, which folds to "k"
    ".ENV\u0301",  # a combining mark after a protected prefix
    "ID_RSA\u00e9",
    ".\u0131ssh",  # dotless i
    ".DOCKER\u0130",  # capital I with dot above
    "CONFIG.JSON\u00df",
]


def _spellings(word: str) -> list[str]:
    return sorted({word, word.upper(), word.title(), word.swapcase()})


def _components() -> list[str]:
    words: set[str] = set(ORDINARY) | set(NON_ASCII)
    words |= set(NAMES)
    words |= {p + "x" for p in PREFIXES} | set(PREFIXES)
    words |= {"x" + s for s in SUFFIXES} | set(SUFFIXES)
    for folder, name in PAIRS:
        words |= {folder, name}
    return sorted({s for w in words for s in _spellings(w)})


def test_it_answers_as_the_whole_path_test() -> None:
    names = _components()
    parts = sorted(
        {*ORDINARY[:4], *NON_ASCII[:4], ".Docker", ".AWS", ".ssh", "gh", ".envs", "k.PEM"}
    )
    folders = [""] + ["/".join(c) for n in (1, 2) for c in itertools.product(parts, repeat=n)]
    checked = protected = 0
    for folder in folders:
        fast = protected_in(folder)
        for name in names:
            path = f"{folder}/{name}" if folder else name
            expected = whole(path)
            assert fast(name) is expected, path
            checked += 1
            protected += expected
    # Both answers occur often: the comparison means something.
    assert checked > 40_000
    assert 0.1 < protected / checked < 0.9


def test_the_pairs_need_their_folder() -> None:
    assert protected_in(".docker")("config.json")
    assert protected_in("home/.DOCKER")("Config.JSON")
    assert not protected_in("docker")("config.json")
    assert not protected_in("")("config.json")
    assert protected_in(".aws/x")("id_rsa.pub")
    assert protected_in("src/.git/objects")("anything")
