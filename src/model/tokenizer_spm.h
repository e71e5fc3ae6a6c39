/* SentencePiece-style BPE tokenizer (tokenizer.ggml.model = "llama") built
 * from the GGUF vocabulary, scores and token types. kkv_tok (tokenizer.h)
 * owns one of these when the file asks for it and forwards to it; nothing
 * else calls this directly. */
#ifndef KKV_MODEL_TOKENIZER_SPM_H
#define KKV_MODEL_TOKENIZER_SPM_H

#include <stddef.h>
#include <stdint.h>

#include "kittykv_model.h"
#include "model/gguf.h"

typedef struct kkv_spm kkv_spm;

/* Builds the tokenizer from g's metadata (copies what it needs; g may be
 * closed afterwards). KKV_ERR_FORMAT, with a one-line message, for a missing
 * or malformed tokens/scores/token_type array (wrong length or element type,
 * a non-finite score, a type outside 1..6, a byte token not spelled <0xHH>). */
kkv_status kkv_spm_from_gguf(kkv_spm **out, const kkv_gguf *g);
void       kkv_spm_free(kkv_spm *s); /* NULL is fine */

int     kkv_spm_n_vocab(const kkv_spm *s);
int     kkv_spm_type(const kkv_spm *s, int32_t token); /* KKV_TOKTYPE_*, -1 out of range */
/* Id of the token whose GGUF text is exactly text[0..n), or -1. */
int32_t kkv_spm_find(const kkv_spm *s, const char *text, size_t n);

/* Tokens of text[0..len) into *ids (malloc'd, the caller frees, also on
 * error: NULL then), *n their count; bos >= 0 is put first. special: control
 * token texts become their ids (user-defined ones always do). */
kkv_status kkv_spm_encode(const kkv_spm *s, int32_t **ids, size_t *n, const char *text,
                          size_t len, int32_t bos, int special);
/* Raw bytes of a token, borrowed from s: *p [*n]. The token must be in range. */
void kkv_spm_piece(const kkv_spm *s, int32_t token, const char **p, size_t *n);

/* Elementary encoding steps on this thread so far (see kkv_tok_work). */
uint64_t kkv_spm_work(void);

#endif
