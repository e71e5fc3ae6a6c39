/* Chat templates on the GGUF metadata and tokenizer alone, so that tools that
 * do not load the weights (kittykv tokenize) can format chats too. The public
 * kkv_chat_* calls in kittykv.h wrap these with the model's gguf and tok. */
#ifndef KKV_MODEL_CHAT_H
#define KKV_MODEL_CHAT_H

#include <stddef.h>

#include "kittykv.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

/* As kkv_chat_template_detect, on g's tokenizer.chat_template. */
kkv_status kkv_chat_detect_gguf(const kkv_gguf *g, const char **name);

/* As kkv_chat_format; g: the template (and its default system message),
 * t: the special tokens. */
kkv_status kkv_chat_apply(const kkv_gguf *g, const kkv_tok *t, char *buf, size_t cap,
                          size_t *len, const kkv_chat_msg *msgs, int n, int add_gen,
                          const char *name);

#endif
