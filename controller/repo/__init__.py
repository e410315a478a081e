"""The user's repository, never written: the git runner, its layout, the private baseline."""
