"""Text: the streaming generator, detokenizer, prompts, chat sessions and stats."""
