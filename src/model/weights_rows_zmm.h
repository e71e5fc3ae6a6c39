/* The 512-bit register set of weights_rows_body.h (sixteen rows, one per
 * lane; AVX-512 VNNI builds only). Include right before the body, after
 * defining RW_FN, RW_ROWS_T and RW_ROWS_F16; the body undefines every RW_
 * name. */
#define RW_N      16
#define RW_I      __m512i
#define RW_F      __m512
#define RW_ZERO_I _mm512_setzero_si512
#define RW_ZERO_F _mm512_setzero_ps
#define RW_SET8   _mm512_set1_epi8
#define RW_SET16  _mm512_set1_epi16
#define RW_SET32  _mm512_set1_epi32
#define RW_SETF   _mm512_set1_ps
#define RW_AND    _mm512_and_si512
#define RW_XOR    _mm512_xor_si512
#define RW_SRLI16 _mm512_srli_epi16
#define RW_SRLI32 _mm512_srli_epi32
#define RW_SRAI16 _mm512_srai_epi16
#define RW_SLLI32 _mm512_slli_epi32
#define RW_MADDUBS _mm512_maddubs_epi16
#define RW_MADD   _mm512_madd_epi16
#define RW_SUBF   _mm512_sub_ps
#define RW_SLLI16 _mm512_slli_epi16
#define RW_OR     _mm512_or_si512
#define RW_ADD32  _mm512_add_epi32
#define RW_ADD16  _mm512_add_epi16
#define RW_SUB32  _mm512_sub_epi32
#define RW_DPB    _mm512_dpbusd_epi32
#define RW_CVT    _mm512_cvtepi32_ps
#define RW_MUL    _mm512_mul_ps
#define RW_ADDF   _mm512_add_ps
#define RW_STORE  _mm512_storeu_ps
#define RW_DPBUSD 1
