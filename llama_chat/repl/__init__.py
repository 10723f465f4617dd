"""The terminal chat: input loop (app), slash commands (commands), output (render)."""
