/* examples/gpt/unicode_data.h — the Unicode tables of the tokenizer.json
 * reader (generated into unicode_data.c by tools/gen_unicode.py). Each row
 * is {first, last or second, value}, sorted by its first column:
 *   gpt_uni_class   {first, last, 1 letter (\p{L}) | 2 number (\p{N}), + 4 when
 *                   a word's (\w: letters, marks, Nd, Nl, Pc, the joiners)}
 *   gpt_uni_ccc     {first, last, canonical combining class}
 *   gpt_uni_decomp  {code point, first, second | bit 31 when it composes}
 *                   (second 0: a one code point decomposition)
 */
#ifndef FERRY_GPT_UNICODE_DATA_H
#define FERRY_GPT_UNICODE_DATA_H

#include <stddef.h>
#include <stdint.h>

extern const uint32_t gpt_uni_class[][3];
extern const size_t gpt_uni_class_n;
extern const uint32_t gpt_uni_ccc[][3];
extern const size_t gpt_uni_ccc_n;
extern const uint32_t gpt_uni_decomp[][3];
extern const size_t gpt_uni_decomp_n;

#endif /* FERRY_GPT_UNICODE_DATA_H */
