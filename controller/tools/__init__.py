"""The six tools a model may call: their schemas, the write policy, the executor, text cleaning."""
