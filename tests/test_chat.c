/* Chat templates (kkv_chat_format) on vocabulary-only GGUF files written
 * here: a byte-level vocabulary of the 256 byte tokens plus the special
 * tokens of every family, and a tokenizer.chat_template holding a family's
 * markers. Checks each family's exact text (the strings the families' Jinja
 * templates render; tests/oracle/test_chat.py renders the real templates with
 * jinja2), ChatML's default system message in both spellings (a real newline
 * and a Jinja "\n" escape) and only for the model's own template, detection,
 * and the refusals: unknown name, unrecognised or missing template, a role
 * outside the three, a late system message, missing special tokens, and a
 * buffer too small (length reported, buffer untouched). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kittykv.h"
#include "kittykv_model.h"
#include "model/tokenizer.h"
#include "testutil.h"
#include "tu_bytes.h"

static void kv_str(wbuf *b, const char *k, const char *v) {
    put_str(b, k);
    put_u32(b, 8);
    put_str(b, v);
}
static void kv_u32(wbuf *b, const char *k, uint32_t v) {
    put_str(b, k);
    put_u32(b, 4);
    put_u32(b, v);
}

static const char *SPECIALS[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|start_header_id|>",
                                 "<|end_header_id|>", "<|eot_id|>", "<s>", "</s>", "<start_of_turn>",
                                 "<end_of_turn>"};
#define N_SPECIAL (int)(sizeof SPECIALS / sizeof SPECIALS[0])

/* Writes a vocabulary-only GGUF; tmpl NULL = no chat template; with_specials
 * 0 leaves the special tokens out (only <|endoftext|> as BOS/EOS). */
static int write_vocab(const char *path, const char *tmpl, int with_specials, int bos, int eos) {
    wbuf b = {0};
    int n_sp = with_specials ? N_SPECIAL : 1;
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 0);                 /* tensors */
    put_u64(&b, tmpl ? 9 : 8);      /* key/values */
    kv_str(&b, "general.architecture", "llama");
    kv_str(&b, "tokenizer.ggml.model", "gpt2");
    kv_str(&b, "tokenizer.ggml.pre", "gpt2");
    put_str(&b, "tokenizer.ggml.tokens");
    put_u32(&b, 9);
    put_u32(&b, 8);
    put_u64(&b, 256 + 1 + (uint64_t)n_sp);
    for (int c = 0; c < 256; c++) {
        uint32_t cp = kkv_tok_byte_to_cp((uint8_t)c);
        char u[4];
        size_t n = 0;
        if (cp < 0x80) u[n++] = (char)cp;
        else {
            u[n++] = (char)(0xc0 | (cp >> 6));
            u[n++] = (char)(0x80 | (cp & 0x3f));
        }
        put_u64(&b, n);
        put(&b, u, n);
    }
    put_str(&b, "ab");
    for (int i = 0; i < n_sp; i++) put_str(&b, SPECIALS[i]);
    put_str(&b, "tokenizer.ggml.token_type");
    put_u32(&b, 9);
    put_u32(&b, 5);
    put_u64(&b, 256 + 1 + (uint64_t)n_sp);
    for (int i = 0; i < 257; i++) put_u32(&b, 1);
    for (int i = 0; i < n_sp; i++) put_u32(&b, 3);
    put_str(&b, "tokenizer.ggml.merges");
    put_u32(&b, 9);
    put_u32(&b, 8);
    put_u64(&b, 1);
    put_str(&b, "a b");
    kv_u32(&b, "tokenizer.ggml.bos_token_id", (uint32_t)(257 + (with_specials ? bos : 0)));
    kv_u32(&b, "tokenizer.ggml.eos_token_id", (uint32_t)(257 + (with_specials ? eos : 0)));
    if (tmpl) kv_str(&b, "tokenizer.chat_template", tmpl);
    while (b.n % 32) put(&b, "", 1);
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(b.p, 1, b.n, f) == b.n;
    if (f) ok = fclose(f) == 0 && ok;
    free(b.p);
    return ok ? 0 : -1;
}

static char g_dir[] = "/tmp/kkv_test_chat_XXXXXX";

static kkv_model *vocab(const char *tmpl, int with_specials, int bos, int eos) {
    char path[128];
    snprintf(path, sizeof path, "%s/v.gguf", g_dir);
    if (write_vocab(path, tmpl, with_specials, bos, eos)) return NULL;
    kkv_model *m = NULL;
    if (kkv_model_load_vocab(&m, path, NULL) != KKV_OK) {
        fprintf(stderr, "load_vocab: %s\n", kkv_last_error());
        m = NULL;
    }
    remove(path);
    CHECK(m != NULL, "vocabulary file did not load");
    return m;
}

static const kkv_chat_msg CONV[] = {
    {"system", "Be brief."}, {"user", " Hi "}, {"assistant", "Hello!\n"}, {"user", "Bye"}};

/* Formats and compares; name NULL = the model's template. */
static void expect(const kkv_model *m, const kkv_chat_msg *msgs, int n, int gen, const char *name,
                   const char *want, const char *what) {
    char buf[1024];
    size_t len = 0;
    kkv_status s = kkv_chat_format(m, buf, sizeof buf, &len, msgs, n, gen, name);
    CHECK(s == KKV_OK, "%s: %s", what, kkv_last_error());
    if (s != KKV_OK) return;
    CHECK(len == strlen(want) && strcmp(buf, want) == 0, "%s:\n  got  '%s'\n  want '%s'", what, buf, want);
}

static void expect_fail(const kkv_model *m, const kkv_chat_msg *msgs, int n, const char *name,
                        kkv_status want, const char *part, const char *what) {
    char buf[256] = "untouched";
    size_t len = 12345;
    kkv_status s = kkv_chat_format(m, buf, sizeof buf, &len, msgs, n, 1, name);
    CHECK(s == want, "%s: got %s (%s)", what, kkv_status_str(s), kkv_last_error());
    CHECK(strstr(kkv_last_error(), part) != NULL, "%s: message '%s' lacks '%s'", what, kkv_last_error(), part);
    CHECK(!strcmp(buf, "untouched") && len == 12345, "%s: outputs changed on failure", what);
}

int main(void) {
    if (!mkdtemp(g_dir)) {
        CHECK(0, "mkdtemp");
        return tu_summary();
    }
    /* ChatML with SmolLM2's default system message (a real newline in the literal) */
    kkv_model *m = vocab("{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
                         "You are SmolLM<|im_end|>\n' }}{% endif %}<|im_start|>", 1, 0, 2);
    if (m) {
        const char *name = NULL;
        CHECK(kkv_chat_template_detect(m, &name) == KKV_OK && !strcmp(name, "chatml"), "detect chatml");
        expect(m, CONV + 1, 1, 1, NULL,
               "<|im_start|>system\nYou are SmolLM<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n"
               "<|im_start|>assistant\n", "chatml, default system");
        expect(m, CONV, 4, 0, NULL,
               "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n"
               "<|im_start|>assistant\nHello!\n<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n",
               "chatml, own system, no generation prompt");
        /* too small: the length is reported, the buffer stays as it was */
        char small[8] = "keep";
        size_t len = 0;
        CHECK(kkv_chat_format(m, small, sizeof small, &len, CONV + 1, 1, 1, NULL) == KKV_ERR_INVALID_ARG &&
                  len == strlen("<|im_start|>system\nYou are SmolLM<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n"
                                "<|im_start|>assistant\n") && !strcmp(small, "keep"),
              "small buffer: len %zu", len);
        /* other families by name on this vocabulary */
        expect(m, CONV, 4, 1, "llama3",
               "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user"
               "<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello!"
               "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>"
               "assistant<|end_header_id|>\n\n", "llama3");
        expect(m, CONV, 4, 1, "gemma",
               "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
               "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n", "gemma");
        expect_fail(m, CONV, 1, "vicuna", KKV_ERR_INVALID_ARG, "unknown template 'vicuna'", "unknown name");
        const kkv_chat_msg late[] = {{"user", "a"}, {"system", "b"}};
        expect_fail(m, late, 2, "gemma", KKV_ERR_INVALID_ARG, "system message only first", "late system");
        const kkv_chat_msg tool[] = {{"tool", "a"}};
        expect_fail(m, tool, 1, NULL, KKV_ERR_INVALID_ARG, "role 'tool'", "bad role");
        kkv_model_free(m);
    }
    /* Qwen-style default system message, Jinja escapes; named as chatml by the
     * caller it is still the model's own, so the default stays */
    m = vocab("{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
              "'<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen.\\tOK<|im_end|>\\n' }}{%- endif %}",
              1, 0, 2);
    if (m) {
        expect(m, CONV + 3, 1, 1, "chatml",
               "<|im_start|>system\nYou are Qwen.\tOK<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
               "<|im_start|>assistant\n", "chatml, escaped default system");
        kkv_model_free(m);
    }
    /* Llama 2 and Mistral: BOS <s> (6), EOS </s> (7) */
    m = vocab("{{ bos_token + '[INST] ' + '<<SYS>>\\n' }}", 1, 6, 7);
    if (m) {
        const char *name = NULL;
        CHECK(kkv_chat_template_detect(m, &name) == KKV_OK && !strcmp(name, "llama2"), "detect llama2");
        expect(m, CONV, 4, 1, NULL,
               "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi [/INST] Hello! </s><s>[INST] Bye [/INST]", "llama2");
        expect(m, CONV, 4, 1, "mistral", "[INST] Be brief.\n\n Hi  [/INST]Hello!\n</s>[INST] Bye [/INST]",
               "mistral");
        expect(m, CONV, 4, 0, "chatml",
               "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n<|im_start|>assistant\n"
               "Hello!\n<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n", "chatml on a llama2 file: no default");
        kkv_model_free(m);
    }
    m = vocab("{{ '[INST] ' }}", 1, 6, 7);
    if (m) {
        const char *name = NULL;
        CHECK(kkv_chat_template_detect(m, &name) == KKV_OK && !strcmp(name, "mistral"), "detect mistral");
        kkv_model_free(m);
    }
    m = vocab("<start_of_turn>", 1, 0, 9);
    if (m) {
        const char *name = NULL;
        CHECK(kkv_chat_template_detect(m, &name) == KKV_OK && !strcmp(name, "gemma"), "detect gemma");
        kkv_model_free(m);
    }
    /* refusals of the model's template */
    m = vocab("{% for m in messages %}{{ m['content'] }}{% endfor %}", 1, 0, 2);
    if (m) {
        expect_fail(m, CONV, 1, NULL, KKV_ERR_UNSUPPORTED, "none of the known families", "unknown family");
        kkv_model_free(m);
    }
    m = vocab(NULL, 1, 0, 2);
    if (m) {
        expect_fail(m, CONV, 1, NULL, KKV_ERR_NOT_FOUND, "no tokenizer.chat_template", "no template");
        expect(m, CONV + 1, 1, 1, "chatml", "<|im_start|>user\n Hi <|im_end|>\n<|im_start|>assistant\n",
               "no template, named");
        kkv_model_free(m);
    }
    m = vocab("<|im_start|>", 0, 0, 0);
    if (m) {
        expect_fail(m, CONV, 1, NULL, KKV_ERR_UNSUPPORTED, "'<|im_start|>'", "missing special token");
        kkv_model_free(m);
    }
    CHECK(kkv_chat_template_names()[0] && !strcmp(kkv_chat_template_names()[4], "mistral") &&
              !kkv_chat_template_names()[5], "names");
    rmdir(g_dir);
    return tu_summary();
}
