"""Models by name: a path, a Hugging Face Hub id, or a model another tool keeps on this
machine (ollama's store, LM Studio's folders, the Hugging Face cache), each resolved to
the local files the checkpoint readers open (resolve.py), and listed (catalog.py)."""
