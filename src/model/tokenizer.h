/* Byte-level BPE tokenizer built from the GGUF vocabulary
 * (tokenizer.ggml.tokens / merges / token_type / *_token_id), with the
 * pre-tokenizer split of the model's tokenizer.ggml.pre (PCRE2, Unicode);
 * or, for tokenizer.ggml.model "llama", SentencePiece BPE over the tokens,
 * scores and types (tokenizer_spm.c), behind the same calls. */
#ifndef KKV_MODEL_TOKENIZER_H
#define KKV_MODEL_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "kittykv_model.h"
#include "model/gguf.h"

typedef struct kkv_tok kkv_tok;

/* Builds a tokenizer from the metadata of g (copies what it needs; g may be
 * closed afterwards). KKV_ERR_UNSUPPORTED for a tokenizer model other than
 * "gpt2" (byte-level BPE) or "llama" (SentencePiece) or an unknown
 * pre-tokenizer; KKV_ERR_FORMAT for missing/inconsistent arrays. */
kkv_status kkv_tok_from_gguf(kkv_tok **out, const kkv_gguf *g);
void       kkv_tok_free(kkv_tok *t);

int        kkv_tok_n_vocab(const kkv_tok *t);
int32_t    kkv_tok_bos(const kkv_tok *t);      /* -1 if none */
int32_t    kkv_tok_eos(const kkv_tok *t);      /* -1 if none */
int32_t    kkv_tok_eot(const kkv_tok *t);      /* <|im_end|> or similar, -1 */
int        kkv_tok_wants_bos(const kkv_tok *t); /* tokenizer.ggml.add_bos_token */
/* Id of the token whose text is exactly `text`, or -1. */
int32_t    kkv_tok_find(const kkv_tok *t, const char *text);

/* Same contract as kkv_tokenize() in kittykv.h. */
kkv_status kkv_tok_encode(const kkv_tok *t, int32_t *tokens, int cap, int *n_out,
                          const char *text, size_t len, int add_bos, int special);
/* Same contract as kkv_token_piece() in kittykv.h. */
kkv_status kkv_tok_piece(const kkv_tok *t, char *buf, size_t cap, size_t *n_out,
                         int32_t token);

/* ---- additions (tokenizer engineer) ---- */

/* Token types of tokenizer.ggml.token_type. */
enum {
    KKV_TOKTYPE_NORMAL = 1, KKV_TOKTYPE_UNKNOWN = 2, KKV_TOKTYPE_CONTROL = 3,
    KKV_TOKTYPE_USER = 4, KKV_TOKTYPE_UNUSED = 5, KKV_TOKTYPE_BYTE = 6,
};

/* As kkv_tok_from_gguf, but with the pre-tokenizer named `pre` instead of the
 * model's tokenizer.ggml.pre (NULL: the model's). For tests and the CLI's
 * --pre. Known names: see kkv_tok_pre_names(). A SentencePiece vocabulary
 * has no pre-tokenizer: any `pre` is KKV_ERR_UNSUPPORTED there. */
kkv_status kkv_tok_from_gguf_pre(kkv_tok **out, const kkv_gguf *g, const char *pre);
/* The pre-tokenizer names this build knows, NULL-terminated. */
const char *const *kkv_tok_pre_names(void);
/* The pre-tokenizer name in use (never NULL; "none (SentencePiece)"). */
const char *kkv_tok_pre_name(const kkv_tok *t);
/* Type of a token (KKV_TOKTYPE_*), or -1 for an id out of range. */
int        kkv_tok_type(const kkv_tok *t, int32_t token);

/* GPT-2 byte-level alphabet: the code point that stands for byte b in the
 * vocabulary's token texts, and the inverse (-1 if cp stands for no byte). */
uint32_t   kkv_tok_byte_to_cp(uint8_t b);
int        kkv_tok_cp_to_byte(uint32_t cp);

/* Elementary steps kkv_tok_encode has taken on this thread so far (heap
 * operations, regex calls, special-token probes). A work counter for tests
 * that check complexity without a clock; differences between two reads. */
uint64_t kkv_tok_work(void);

#endif
