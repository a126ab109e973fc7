/* membership_constants.h: every tunable and limit of the membership
 * machine (gossip/membership*.c), each beside the reasoning that chose it.
 *
 * Follows SWIM (Das, Gupta, Motivala, DSN 2002) and Lifeguard (Dadgar,
 * Phillips, Currey, "Lifeguard: Local Health Awareness for More Accurate
 * Failure Detection", 2018) as HashiCorp's memberlist runs them: the
 * defaults are memberlist's DefaultLANConfig, and the scaling rules are
 * memberlist's (util.go: suspicionTimeout, retransmitLimit, pushPullScale;
 * suspicion.go: remainingSuspicionTime; awareness.go). Internal to gossip/.
 */
#ifndef STARLING_GOSSIP_MEMBERSHIP_CONSTANTS_H
#define STARLING_GOSSIP_MEMBERSHIP_CONSTANTS_H

/* ---- Failure detection (SWIM) ---------------------------------------------
 *
 * One probe a second: SWIM's protocol period T'. A crashed member is
 * probed by someone within about one period (every member probes one
 * other, so the chance that nobody picks the dead one in a round is
 * (1 - 1/(N-1))^(N-1) ~ 1/e, and the round-robin order bounds the worst
 * case at 2(N-1) periods). One second is memberlist's LAN choice: small
 * against the seconds a training step takes, large against LAN RTTs. */
#define ST_MEMBERSHIP_PROBE_INTERVAL_MS 1000u

/* A direct ping waits 500 ms for its ack before asking others: an order of
 * magnitude above a LAN's 99.9th percentile RTT, yet leaving half of the
 * period for the indirect probes (memberlist ProbeTimeout). */
#define ST_MEMBERSHIP_PROBE_TIMEOUT_MS 500u

/* k = 3 members ping the target on our behalf after a missed ack. With
 * independent loss p per packet, an indirect path fails with ~4p (four
 * packets) and all k fail with (4p)^k: at p = 5% that is 0.8% a probe,
 * against 10% for the direct path alone (memberlist IndirectChecks). */
#define ST_MEMBERSHIP_INDIRECT_CHECKS 3u
/* The most indirect checks a configuration may ask for: it sizes the
 * confirmation set of every suspicion. */
#define ST_MEMBERSHIP_MAX_INDIRECT_CHECKS 16u

/* ---- Suspicion (SWIM section 4.2, Lifeguard section 4.2) -------------------
 *
 * A suspected member has min = mult * max(1, log10(N)) * probe_interval
 * to refute before it is declared dead: 4 s up to 10 members, 8 s at 100,
 * 16 s at 10,000. The log10(N) term is the number of gossip rounds a
 * suspicion needs to reach everyone (and the refutation to come back), so
 * the refutation window grows with the time dissemination takes
 * (memberlist SuspicionMult = 4). */
#define ST_MEMBERSHIP_SUSPICION_MULT 4u

/* Lifeguard's dynamic suspicion starts each timer at max = 6 * min and
 * shrinks it toward min as independent members confirm the suspicion:
 *   timeout(C) = max(min, max - (max - min) * log(C + 1) / log(K + 1))
 * with C distinct confirmations (the first suspector does not count) and
 * K = indirect_checks expected ones. A member suspected by one slow prober
 * alone gets the long timeout, one that K others also cannot reach dies
 * at min: few false deaths, detection as fast as plain SWIM when the
 * evidence agrees (memberlist SuspicionMaxTimeoutMult = 6). Where fewer
 * than K members could confirm (N - 2 < K), the timer is min from the
 * start, as in memberlist. With Lifeguard off the timeout is min, fixed. */
#define ST_MEMBERSHIP_SUSPICION_MAX_MULT 6u

/* ---- Dissemination (SWIM section 4.1) ---------------------------------------
 *
 * Each update rides on at most mult * ceil(log10(N + 1)) packets: 4 for a
 * lone pair, 12 at 100 to 999 members, 20 at 10,000. Infection-style
 * spreading reaches all N members after O(log N) rounds with high
 * probability, and SWIM's analysis needs lambda * log(N) transmissions per
 * update for that; lambda = 4 is memberlist's RetransmitMult. */
#define ST_MEMBERSHIP_RETRANSMIT_MULT 4u
/* The transmit counter is a byte; a limit never exceeds this. */
#define ST_MEMBERSHIP_MAX_TRANSMITS 255u

/* Besides the piggybacking on probes and acks, every 200 ms the machine
 * sends its pending updates to 3 random members: 15 gossip packets a
 * second per member at most, constant in N, and an update then spreads by
 * a factor of ~4 each 200 ms instead of each second (memberlist
 * GossipInterval, GossipNodes). Recently dead members stay eligible for
 * gossip (as memberlist's GossipToTheDeadTime), so that a falsely declared
 * member hears of it and refutes. */
#define ST_MEMBERSHIP_GOSSIP_INTERVAL_MS 200u
#define ST_MEMBERSHIP_GOSSIP_NODES 3u
/* Random members (gossip targets, ping-req intermediaries) are drawn by
 * random picks, 3 per member wanted plus 64 (memberlist's kRandomNodes
 * tries 3n, which is O(N)); in tables of at most 64 members they are
 * drawn exactly instead, so that k are found whenever k exist. */
#define ST_MEMBERSHIP_RANDOM_TRIES 3u
#define ST_MEMBERSHIP_SMALL_TABLE 64u
/* A joiner re-gossips the members its seed's reply taught it only when
 * there are at most 64 (memberlist re-gossips them all): that costs at
 * most 64 * 8 updates, 35 packets, and keeps a cluster that bootstraps
 * in a burst converging by gossip; beyond, the joiner would spend minutes
 * of full packets repeating what every old member knows. */
#define ST_MEMBERSHIP_QUIET_JOIN 64u

/* ---- Push-pull (anti-entropy) ----------------------------------------------
 *
 * Every 30 s a full state exchange with one random member repairs whatever
 * gossip lost (memberlist PushPullInterval). Its cost grows with N (an
 * entry per member), so above 32 members the interval is stretched by
 *   ceil(log2(N) - log2(32)) + 1
 * (memberlist pushPullScale): 2x at 33 to 64 members, 6x (3 minutes) at
 * 1,024, 10x (5 minutes) at 10,000, which keeps the bytes each member
 * spends on push-pull per second nearly flat. */
#define ST_MEMBERSHIP_PUSH_PULL_INTERVAL_MS 30000u
#define ST_MEMBERSHIP_PUSH_PULL_SCALE_THRESHOLD 32u

/* ---- Local health (Lifeguard section 4.1) -----------------------------------
 *
 * The awareness score counts evidence that this member, not its targets,
 * is slow: +1 for a probe that failed with no nack to explain it (or per
 * missing nack), +1 when it hears itself suspected, -1 per successful
 * probe. The probe interval and timeout are multiplied by (score + 1), so
 * a struggling member probes less and waits longer before it accuses
 * anyone. It saturates at awareness_max - 1 = 7: at most an 8 s interval,
 * memberlist AwarenessMaxMultiplier = 8. */
#define ST_MEMBERSHIP_AWARENESS_MAX 8u

/* A ping-req intermediary that has heard nothing from the target after 80%
 * of the probe timeout answers with a nack (Lifeguard's NACK): the prober
 * then knows its own link to the intermediary works, and a missing nack
 * is counted against the prober's own health (memberlist's ackTimeout *
 * 80 / 100). */
#define ST_MEMBERSHIP_NACK_PERCENT 80u

/* ---- Memory bounds
 * -----------------------------------------------------------
 *
 * A dead (or left) member is remembered for 30 s, then forgotten, so that
 * churn cannot grow the table: long enough for its death to be gossiped
 * to everyone (O(log N) rounds of 200 ms) and for gossip to the dead to let
 * a wrongly declared member refute; memberlist removes dead members after
 * GossipToTheDeadTime = 30 s on LAN. */
#define ST_MEMBERSHIP_DEAD_RECLAIM_MS 30000u
/* Reconnect after a partition (memberlist leaves this to serf's
 * reconnect). Once both sides of a split have declared each other dead and
 * forgotten them, no probe, gossip or push-pull ever crosses again. So
 * each push-pull period a machine also tries one push-pull with a member
 * it holds dead or buried recently: after the heal, the first such
 * exchange teaches each side the other (or makes it refute), and gossip
 * does the rest. The burial ground keeps the 64 most recently forgotten
 * DEAD (not LEFT) members' ids and addresses for an hour: 64 entries
 * cover the far side of a split of a 128-member cluster, one is enough to
 * heal it, and the cost is about 3.5 KB a machine (allocated when the
 * first member is buried) and one extra stream a push-pull period while
 * anyone is held dead (serf's ReconnectInterval is 30 s, comparable). */
#define ST_MEMBERSHIP_GRAVES 64u
#define ST_MEMBERSHIP_GRAVE_KEEP_MS 3600000u
/* The most members one machine holds, a bound on memory whatever the
 * network claims (160 bytes a member in the table, 10 MiB at the cap);
 * ALIVE claims for new members beyond it are refused and counted. */
#define ST_MEMBERSHIP_MAX_MEMBERS 65536u
/* Ping-reqs served at once. A member receives about k of them a probe
 * period (each member is asked by the probers of k targets' neighbours);
 * 64 leaves room for bursts, and the oldest is dropped beyond. */
#define ST_MEMBERSHIP_MAX_RELAYS 64u
/* Seeds one join may name. */
#define ST_MEMBERSHIP_MAX_SEEDS 64u
/* When a packet's broadcasts are chosen, updates that do not fit in the
 * room left are skipped; after this many misses the packet is sent as is
 * (updates differ little in size, so a miss means the packet is full). */
#define ST_MEMBERSHIP_PACK_MISSES 4u
/* The action queue and the byte arena keep at most this much capacity
 * once drained, so that a burst (a full push-pull) is not held for ever by
 * each of the thousands of machines a simulator runs. */
#define ST_MEMBERSHIP_KEEP_ACTIONS 64u
#define ST_MEMBERSHIP_KEEP_BROADCASTS 256u
#define ST_MEMBERSHIP_KEEP_ARENA_BYTES 16384u

#endif /* STARLING_GOSSIP_MEMBERSHIP_CONSTANTS_H */
