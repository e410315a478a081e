"""One job from task to decision: the engine and its loop, records, required checks, evidence."""
