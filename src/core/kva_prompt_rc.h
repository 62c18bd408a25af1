/*
 * kv_aware core: why a body yields no prompt.  One list for the lexer,
 * the walker, the prompt scanner and the key functions above them, kept
 * apart so that the lowest of them need not include the highest.
 */

#ifndef _KVA_PROMPT_RC_H_INCLUDED_
#define _KVA_PROMPT_RC_H_INCLUDED_


typedef enum {
    KVA_PROMPT_OK = 0,
    KVA_PROMPT_NOT_JSON,        /* syntax error, bad escape, trailing data */
    KVA_PROMPT_BAD_UTF8,        /* invalid UTF-8 or lone surrogate escape */
    KVA_PROMPT_TOO_DEEP,        /* nesting over KVA_PROMPT_MAX_DEPTH */
    KVA_PROMPT_NO_PROMPT,       /* valid JSON, but no messages/prompt/input */
    KVA_PROMPT_EMPTY,           /* empty body */
    KVA_PROMPT_SEAM             /* kva_hash_body2() only: a number across
                                   its seam; hash a copy in one piece */
} kva_prompt_rc_e;


#define KVA_PROMPT_MAX_DEPTH   64       /* nesting deeper than this: error */


#endif /* _KVA_PROMPT_RC_H_INCLUDED_ */
