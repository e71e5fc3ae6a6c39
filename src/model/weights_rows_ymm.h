/* The 256-bit register set of weights_rows_body.h (eight rows, one per
 * lane). Include right before the body, after defining RW_FN, RW_ROWS_T and
 * RW_ROWS_F16; the body undefines every RW_ name. */
#define RW_N      8
#define RW_I      __m256i
#define RW_F      __m256
#define RW_ZERO_I _mm256_setzero_si256
#define RW_ZERO_F _mm256_setzero_ps
#define RW_SET8   _mm256_set1_epi8
#define RW_SET16  _mm256_set1_epi16
#define RW_SET32  _mm256_set1_epi32
#define RW_SETF   _mm256_set1_ps
#define RW_AND    _mm256_and_si256
#define RW_XOR    _mm256_xor_si256
#define RW_SRLI16 _mm256_srli_epi16
#define RW_SRLI32 _mm256_srli_epi32
#define RW_SRAI16 _mm256_srai_epi16
#define RW_SLLI32 _mm256_slli_epi32
#define RW_MADDUBS _mm256_maddubs_epi16
#define RW_MADD   _mm256_madd_epi16
#define RW_SUBF   _mm256_sub_ps
#define RW_SLLI16 _mm256_slli_epi16
#define RW_OR     _mm256_or_si256
#define RW_ADD32  _mm256_add_epi32
#define RW_ADD16  _mm256_add_epi16
#define RW_SUB32  _mm256_sub_epi32
#define RW_DPB    dpb
#define RW_CVT    _mm256_cvtepi32_ps
#define RW_MUL    _mm256_mul_ps
#define RW_ADDF   _mm256_add_ps
#define RW_STORE  _mm256_storeu_ps
#ifdef KKV_WT_DPBUSD
#define RW_DPBUSD 1
#endif
