"""The in-container tool agent of patchbox (Python standard library only, python3 >= 3.9)."""
