/*
 * kv_aware core: KV event protocol v1 (docs/events.md), JSON <-> batches.
 *
 * Shared by the module (decoder, kva_event.c) and the publishers (encoder,
 * kva_event_encode.c): the simulator, and later a bridge from vLLM.  Both
 * use jansson; events are small next to prompts, so neither is on the
 * routing path.
 */

#ifndef _KVA_EVENT_H_INCLUDED_
#define _KVA_EVENT_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>


#define KVA_EVENT_SERVER_MAX   128
/* data-parallel ranks of one server: "rank" 0 .. 63 */
#define KVA_EVENT_RANK_MAX     1023

/*
 * The pre-scan's bounds (kva_event_decode() checks them before jansson
 * builds anything).  The protocol nests 4 deep (message, events, event,
 * hashes); 8 leaves room for a v1 extension that adds a small object to
 * an event or to the load, and keeps jansson's recursion shallow.
 */
#define KVA_EVENT_DEPTH_MAX    8
/* an event: itself, type, parent, medium, hashes, and 3 unknown fields */
#define KVA_EVENT_VALUES_PER_EVENT  8
/* v, server, seq, snapshot, keyspace, events, load and its 3: 11, and room */
#define KVA_EVENT_VALUES_ENVELOPE   64
/* an event: its object and its hashes array */
#define KVA_EVENT_CONTAINERS_PER_EVENT  2
/* the message, events and load, and room */
#define KVA_EVENT_CONTAINERS_ENVELOPE   16


typedef enum {
    KVA_EV_STORED = 0,
    KVA_EV_REMOVED,
    KVA_EV_CLEARED
} kva_ev_type_e;


typedef enum {
    KVA_SNAP_NONE = 0,
    KVA_SNAP_FULL,
    KVA_SNAP_BEGIN,
    KVA_SNAP_MORE,
    KVA_SNAP_END
} kva_snap_e;


/*
 * Where a stored block's copy is ("medium"): the fastest tier the server
 * holds it in.  The index's KVA_TIER_* (kva_index_layout.h) alike.
 */
#define KVA_EVENT_TIER_GPU     0
#define KVA_EVENT_TIER_CPU     1
#define KVA_EVENT_TIER_DISK    2
#define KVA_EVENT_TIERS        3


typedef struct {
    kva_ev_type_e       type;
    unsigned            has_parent:1;
    unsigned            tier:2;         /* stored: KVA_EVENT_TIER_*, GPU
                                           when the event says none */
    uint64_t            parent;
    uint64_t           *hashes;         /* into the batch's hash storage */
    size_t              nhashes;
} kva_ev_t;


/* which keys the hashes are: text blocks or token blocks (kva_token.h) */
typedef enum {
    KVA_KEYSPACE_TEXT_KEYS = 0,
    KVA_KEYSPACE_TOKEN_KEYS
} kva_keyspace_e;


typedef struct {
    char                server[KVA_EVENT_SERVER_MAX];
    size_t              server_len;
    unsigned            has_rank:1;     /* "rank" given; else rank 0 */
    uint32_t            rank;           /* data-parallel rank */
    unsigned            has_origin:1;
    uint64_t            origin;         /* the nginx that learned these */
    uint64_t            seq;
    kva_snap_e          snapshot;
    kva_keyspace_e      keyspace;       /* "keyspace", text when absent */
    unsigned            heartbeat:1;    /* no events, no snapshot */
    unsigned            has_load:1;
    uint32_t            waiting;
    uint32_t            running;
    double              kv_usage;
    uint64_t            kv_tokens;      /* the KV pool in tokens, 0: unsaid */

    kva_ev_t           *events;
    size_t              nevents;

    /* owned storage, released by kva_batch_free() */
    uint64_t           *hash_store;
    size_t              hash_count;
} kva_batch_t;


/*
 * With max_hashes and max_events both set, a message may also hold at most
 * max_hashes + KVA_EVENT_VALUES_PER_EVENT * max_events
 * + KVA_EVENT_VALUES_ENVELOPE JSON values, and
 * KVA_EVENT_CONTAINERS_PER_EVENT * max_events
 * + KVA_EVENT_CONTAINERS_ENVELOPE objects and arrays, whatever fields they
 * sit in: the cost of a message is bounded by what it may legitimately
 * carry, not by its size in bytes.
 */
typedef struct {
    size_t              max_message;    /* bytes, 0: no limit */
    size_t              max_hashes;     /* over the whole message, 0: none */
    size_t              max_events;     /* 0: no limit */
} kva_event_limits_t;


/* what kva_event_shape() counts outside strings */
typedef struct {
    size_t              values;         /* every value, members' included */
    size_t              containers;     /* objects and arrays */
    size_t              depth;          /* the deepest nesting */
} kva_event_shape_t;


typedef enum {
    KVA_EVENT_OK = 0,
    KVA_EVENT_TOO_BIG,                  /* message or lists over a limit */
    KVA_EVENT_MALFORMED,                /* not JSON, or not an object */
    KVA_EVENT_BAD_FIELD,                /* a field missing or of a bad type */
    KVA_EVENT_VERSION,                  /* "v" is not 1 */
    KVA_EVENT_NO_MEMORY
} kva_event_rc_e;


/*
 * Decodes one message.  On success b owns heap memory: kva_batch_free().
 * On failure nothing is left to free and err holds a short reason.
 */
kva_event_rc_e kva_event_decode(const char *msg, size_t len,
    const kva_event_limits_t *lim, kva_batch_t *b, char *err,
    size_t err_len);

void kva_batch_free(kva_batch_t *b);

/* 1 when the two batches say the same, field by field, else 0 */
int kva_batch_equal(const kva_batch_t *a, const kva_batch_t *b);

/*
 * The pre-scan: one pass over the bytes, no allocation.  Counts into s
 * and stops at the first count over max (a field 0 in max: no bound);
 * returns 0 if all counts are within max, -1 if not.  Exact for valid
 * JSON; on invalid JSON the counts mean little, jansson rejects it next.
 */
int kva_event_shape(const char *msg, size_t len, const kva_event_shape_t *max,
    kva_event_shape_t *s);

/*
 * Encodes a batch (events, snapshot, load, heartbeat as set in b) into a
 * malloc'ed NUL-terminated string; *len excludes the NUL.  NULL: no
 * memory, an unknown event type, or a server name that is not UTF-8.
 */
char *kva_event_encode(const kva_batch_t *b, size_t *len);

/*
 * {"v":1,"type":"resync","server":"...","rank":r} and its decoder; rank
 * below 0 leaves "rank" out, and a request without it asks for rank 0
 */
char *kva_event_encode_resync(const char *server, size_t server_len,
    int rank, size_t *len);
int kva_event_decode_resync(const char *msg, size_t len, char *server,
    size_t server_cap, size_t *server_len, unsigned *rank);

const char *kva_event_strerror(kva_event_rc_e rc);

/* the protocol's spellings, indexed by kva_snap_e (0: none), kva_ev_type_e */
extern const char  *const kva_event_snap_names[];
extern const char  *const kva_event_keyspace_names[];
extern const char  *const kva_event_type_names[];
extern const char  *const kva_event_tier_names[];

/* 16 lowercase hex digits, no NUL; and back (returns -1 if not hex) */
void kva_hex64(uint64_t v, char out[16]);
int kva_unhex64(const char *s, size_t len, uint64_t *v);


#endif /* _KVA_EVENT_H_INCLUDED_ */
