"""Worker-side transfers between the engine's paged KV cache and the shared CPU region."""
