"""The ``patchbox`` command line: argument parsing, the commands, doctor, the demo."""
