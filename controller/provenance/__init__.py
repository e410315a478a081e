"""Signed provenance of a job's diff: the signing key (:mod:`.keys`), the in-toto statements
and their DSSE envelopes (:mod:`.statement`, :mod:`.envelope`) and their verification
against a key and a policy (:mod:`.verify`). Pure host-side code: nothing here runs in a
sandbox, and the private key never leaves the host's file."""
