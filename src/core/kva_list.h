/*
 * kv_aware core: enums written once, as lists.  A list X(id, name) makes
 * both the enum and its table of names, so that the status pages, the
 * logs and the values cannot drift apart.
 */

#ifndef _KVA_LIST_H_INCLUDED_
#define _KVA_LIST_H_INCLUDED_


#define KVA_LIST_ENUM(id, name)     id,
#define KVA_LIST_NAME(id, name)     name,


#endif /* _KVA_LIST_H_INCLUDED_ */
