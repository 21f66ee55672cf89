"""The text of each completion token as the tokenizer decodes it: what a method that matches phrases (HICRA's
strategic grams) reads, through `CreditBatch.token_texts`."""

from __future__ import annotations

from transformers import ProcessorMixin

# Decoded after this word, a token keeps the space in front of it, which SentencePiece and word-level tokenizers drop
# when they decode one token alone.
_ANCHOR = "a"


class TokenTexts:
    """`token_texts(ids) -> [text of each id]`, each distinct id decoded once (after an anchor token) and cached.

    No clean-up of spaces runs and special tokens keep their text, so that the pieces concatenate to the completion's
    text as the tokenizer decodes it, up to a leading space and to characters spanning several tokens (each piece of
    those decodes to a replacement mark).
    """

    def __init__(self, processing_class):
        is_processor = isinstance(processing_class, ProcessorMixin)
        self.tokenizer = processing_class.tokenizer if is_processor else processing_class
        self.pad_token_id: int | None = self.tokenizer.pad_token_id
        self.cache: dict[int, str] = {}
        anchor = self.tokenizer.encode(_ANCHOR, add_special_tokens=False)
        self.anchor = anchor if len(anchor) == 1 else []
        self.anchor_text = self._decode([self.anchor])[0] if self.anchor else ""

    def _decode(self, sequences: list[list[int]]) -> list[str]:
        return self.tokenizer.batch_decode(sequences, clean_up_tokenization_spaces=False)

    def __call__(self, ids: list[int]) -> list[str]:
        missing = sorted({i for i in ids if i not in self.cache})
        if missing:
            for i, text in zip(missing, self._decode([self.anchor + [i] for i in missing])):
                if self.anchor and text.startswith(self.anchor_text):
                    text = text[len(self.anchor_text) :]
                elif self.anchor:  # the anchor merged with the token: decode it alone
                    text = self._decode([[i]])[0]
                self.cache[i] = text
        return [self.cache[i] for i in ids]
