/*
 * kva_cluster: key slots against the Redis Cluster specification's
 * examples, and CLUSTER SLOTS replies as a Redis 7 node sends them
 * (parsed by hiredis' own reader, as the link receives them).
 */

#include <string.h>

#include <hiredis/hiredis.h>

#include "tap.h"
#include "kva_cluster.h"


#define S(s)  (const unsigned char *) (s), sizeof(s) - 1


static redisReply *
parse(const char *resp)
{
    void          *reply;
    redisReader   *rd;

    rd = redisReaderCreate();
    reply = NULL;

    if (redisReaderFeed(rd, resp, strlen(resp)) != REDIS_OK
        || redisReaderGetReply(rd, &reply) != REDIS_OK)
    {
        reply = NULL;
    }

    redisReaderFree(rd);

    return reply;
}


int
main(void)
{
    int                  here;
    size_t               n;
    redisReply          *r;
    kva_cluster_node_t   owner, nodes[8];

    /* the specification's check value of its CRC16 */
    ok(kva_cluster_crc16(S("123456789")) == 0x31C3, "CRC16(123456789)");

    /* slots as CLUSTER KEYSLOT gives them (checked on redis 7.0.15) */
    ok(kva_cluster_slot(S("foo")) == 12182, "slot of foo is 12182");
    ok(kva_cluster_slot(S("bar")) == 5061, "slot of bar is 5061");

    /* the specification's hash tag examples */
    ok(kva_cluster_slot(S("{user1000}.following"))
       == kva_cluster_slot(S("user1000")),
       "{user1000}.following hashes user1000");
    ok(kva_cluster_slot(S("{user1000}.followers"))
       == kva_cluster_slot(S("{user1000}.following")),
       "{user1000}.followers: the same slot");
    ok(kva_cluster_slot(S("foo{}{bar}"))
       == kva_cluster_crc16(S("foo{}{bar}")) % 16384,
       "foo{}{bar}: an empty tag, the whole name hashed");
    ok(kva_cluster_slot(S("foo{{bar}}zap")) == kva_cluster_slot(S("{bar")),
       "foo{{bar}}zap hashes {bar");
    ok(kva_cluster_slot(S("foo{bar}{zap}")) == kva_cluster_slot(S("bar")),
       "foo{bar}{zap} hashes bar");
    ok(kva_cluster_slot(S("a{b")) == kva_cluster_crc16(S("a{b")) % 16384,
       "an unclosed brace: the whole name");

    ok(kva_cluster_has_tag(S("{kv}:events")), "{kv}:events has a tag");
    ok(!kva_cluster_has_tag(S("kv_aware:events")), "kv_aware:events has none");
    ok(!kva_cluster_has_tag(S("kv{}:events")), "an empty tag is none");

    /* three masters, one replica each; Redis 7 adds metadata to a node */
    r = parse("*3\r\n"
              "*4\r\n:0\r\n:5460\r\n"
                  "*3\r\n$9\r\n127.0.0.1\r\n:7001\r\n$2\r\nm1\r\n"
                  "*3\r\n$9\r\n127.0.0.1\r\n:7004\r\n$2\r\nr1\r\n"
              "*4\r\n:5461\r\n:10922\r\n"
                  "*4\r\n$9\r\n127.0.0.1\r\n:7002\r\n$2\r\nm2\r\n*0\r\n"
                  "*4\r\n$9\r\n127.0.0.1\r\n:7005\r\n$2\r\nr2\r\n*0\r\n"
              "*4\r\n:10923\r\n:16383\r\n"
                  "*3\r\n$0\r\n\r\n:7003\r\n$2\r\nm3\r\n"
                  "*3\r\n$9\r\n127.0.0.1\r\n:7006\r\n$2\r\nr3\r\n");
    ok(r != NULL, "CLUSTER SLOTS reply parsed by hiredis");

    n = 8;
    ok(kva_cluster_owner(r, 5061, &owner, nodes, &n) == KVA_CLUSTER_OK,
       "slot 5061 is covered");
    ok(strcmp(owner.host, "127.0.0.1") == 0 && owner.port == 7001,
       "its owner is the first range's master, not a replica");
    ok(n == 6, "six nodes remembered (%zu)", n);

    n = 8;
    ok(kva_cluster_owner(r, 12182, &owner, nodes, &n) == KVA_CLUSTER_OK
       && owner.host[0] == '\0' && owner.port == 7003,
       "an empty host: the node that answered");

    n = 8;
    ok(kva_cluster_place(r, 12182, "10.0.0.3", 7003, &owner, &here, nodes,
                         &n) == KVA_CLUSTER_OK
       && strcmp(owner.host, "10.0.0.3") == 0 && here,
       "place: an empty host is the node asked, the link stays");
    ok(n == 6 && strcmp(nodes[4].host, "10.0.0.3") == 0,
       "and so is it in the nodes remembered");
    n = 8;
    ok(kva_cluster_place(r, 5061, "10.0.0.3", 7003, &owner, &here, nodes,
                         &n) == KVA_CLUSTER_OK
       && owner.port == 7001 && !here, "place: elsewhere, the link moves");

    n = 2;
    ok(kva_cluster_owner(r, 16383, &owner, nodes, &n) == KVA_CLUSTER_OK
       && n == 2, "the nodes remembered stop at the room given");
    freeReplyObject(r);

    r = parse("*1\r\n*3\r\n:0\r\n:100\r\n"
              "*3\r\n$9\r\n127.0.0.1\r\n:7001\r\n$2\r\nm1\r\n");
    n = 8;
    ok(kva_cluster_owner(r, 5061, &owner, nodes, &n)
       == KVA_CLUSTER_UNCOVERED && n == 1, "an uncovered slot");
    freeReplyObject(r);

    r = parse("*0\r\n");
    n = 8;
    ok(kva_cluster_owner(r, 1, &owner, nodes, &n) == KVA_CLUSTER_UNCOVERED,
       "no ranges at all (a cluster not yet set up)");
    freeReplyObject(r);

    r = parse("-ERR This instance has cluster support disabled\r\n");
    n = 8;
    ok(kva_cluster_owner(r, 1, &owner, nodes, &n) == KVA_CLUSTER_BAD,
       "an error reply is refused");
    freeReplyObject(r);

    r = parse("*1\r\n*3\r\n:0\r\n:100\r\n*2\r\n:1\r\n:7001\r\n");
    n = 8;
    ok(kva_cluster_owner(r, 1, &owner, nodes, &n) == KVA_CLUSTER_BAD,
       "a node without a host string is refused");
    freeReplyObject(r);

    r = parse("*1\r\n*3\r\n:0\r\n:100\r\n"
              "*2\r\n$9\r\n127.0.0.1\r\n:70000\r\n");
    n = 8;
    ok(kva_cluster_owner(r, 1, &owner, nodes, &n) == KVA_CLUSTER_BAD,
       "a port out of range is refused");
    freeReplyObject(r);

    /* a replica named by a long host name, another with port 0 */
    r = parse("*2\r\n*5\r\n:0\r\n:100\r\n"
              "*2\r\n$9\r\n127.0.0.1\r\n:7001\r\n"
              "*2\r\n$70\r\n"
              "redis-1.redis-headless.inference.svc.cluster.local.example.org"
              "-abcdefg\r\n:7004\r\n"
              "*2\r\n$9\r\n127.0.0.1\r\n:0\r\n"
              "*3\r\n:101\r\n:200\r\n"
              "*2\r\n$70\r\n"
              "redis-2.redis-headless.inference.svc.cluster.local.example.org"
              "-abcdefg\r\n:7002\r\n");
    n = 8;
    ok(r != NULL && kva_cluster_owner(r, 1, &owner, nodes, &n)
       == KVA_CLUSTER_OK && owner.port == 7001 && n == 1,
       "bad replicas and another range's bad master are skipped (%zu)", n);
    n = 8;
    ok(r != NULL && kva_cluster_owner(r, 150, &owner, nodes, &n)
       == KVA_CLUSTER_BAD, "but not a bad master of the slot asked");
    freeReplyObject(r);

    ok(kva_cluster_owner(NULL, 1, &owner, nodes, &n) == KVA_CLUSTER_BAD,
       "no reply at all");

    return done_testing();
}
