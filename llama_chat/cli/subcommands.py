"""The sub-commands of `llama-chat`: the module that runs each (its `main(argv)`), and what it does."""

SUBCOMMANDS = {  # name: (module, what it does)
    "bench": ("llama_chat.cli.bench", "measure prefill and decode speed"),
    "download": ("llama_chat.cli.download", "fetch the default model into the weights folder"),
    "pull": ("llama_chat.cli.pull", "fetch a model by name (OWNER/REPO[:QUANT] from the Hugging Face Hub) without chatting"),
    "models": ("llama_chat.cli.models", "every model on this machine llama-chat can run, with the name that loads it"),
    "convert": ("llama_chat.cli.convert", "write a Hugging Face-style directory from a GGUF file or a Meta checkpoint"),
    "train": ("llama_chat.cli.train", "train a small Llama from scratch on text files"),
    "info": ("llama_chat.cli.info", "what a model file holds: shapes, tensor types, license, template, stop tokens"),
    "cache": ("llama_chat.cli.cache", "the packed weights kept on disk (model file, size, last use); `cache clear` removes them"),
    "history": ("llama_chat.cli.history", "the conversations kept, the newest first; `history search WORDS` finds some, "
                "`history rm ID`, `history clear` remove them"),
}
