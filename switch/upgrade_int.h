/* SPDX-License-Identifier: MIT */
/*
 * The upgrade's internal declarations, shared by upgrade.c (parameters,
 * the SPI instance, addresses, handshake messages, fork), accept.c (the
 * listening side) and connect.c (the connecting side).
 */
#ifndef WSD_SWITCH_UPGRADE_INT_H
#define WSD_SWITCH_UPGRADE_INT_H

#include "switch/chan.h"
#include "switch/session.h"

#define ANSWER_MS 5000               /* each side waits this for the other's message */
#define PENDING_MS 10000             /* a HELLO waits this for the application's accept */
/*
 * An OPEN waits this for it: it holds no descriptor, only its place among
 * MAX_PENDING_OPENS, and a server whose accepts run far behind its
 * connections (a thousand at once on a slow machine) still upgrades them,
 * as the kernel's backlog keeps them however long the accept takes.
 */
#define OPEN_PENDING_MS 60000
#define REFUSE_MS 20                 /* a REFUSE waits this for the peer's receive */
/*
 * Requests a process has in hand at once: handshakes waiting for their
 * HELLO (each on a thread of its own, so that a silent one delays nobody
 * else), and HELLOs waiting for the program's accept.  Past these the
 * registry answers REFUSE busy at once: a peer cannot make it hold more
 * provider connections or memory than this.
 */
#define MAX_HANDSHAKES 32
#define MAX_PENDING 64
/*
 * OPENs on channels waiting for the program's accept: each holds a few
 * hundred bytes and no descriptor, and a client that opens connections
 * faster than the server accepts them sends them ahead of the accepts (as
 * the kernel's listen backlog holds connections).  Past it, DECLINE busy,
 * and the connector asks again later.
 */
#define MAX_PENDING_OPENS 4096
/*
 * One peer's share of each of these caps: once half of a cap is in use, a
 * peer process that already holds a quarter of it is answered peer-limit.
 * So no peer holds more than half, and the other half stays for the peers
 * below their share, while a single busy peer still has half of the room.
 * The peer is the process the kernel named at the provider connection's
 * other end (shm), or the channel an OPEN came on; a HELLO over verbs has
 * no process we can tell, and only the caps bound it.
 */
#define PEER_SHARE_OF(cap) ((cap) / 4)

/*
 * What an upgrade costs the process: a new channel (measured: 9
 * descriptors for its provider connection, memory, eventfds and completion
 * path; about as many for the provider's start and a listener's registry
 * entry) and its rings' memory; a connection on a channel that exists
 * takes no descriptor, and its ring's pages only as it uses them.  The
 * switch takes them only with room to spare (wsd_guard_room).
 */
#define UPGRADE_FDS 10
#define START_FDS 12
#define upgrade_bytes() (2 * (uint64_t)wsd_switch_params()->ring_size + (1u << 20))
#define SLOT_BYTES ((uint64_t)64 << 10)

extern pthread_mutex_t up_lock;      /* the SPI's start, the registry list, the job queue */
extern pthread_mutex_t pend_lock;    /* requests in hand, both sides */
extern WSPPROC_TABLE procs;
extern WSAPROTOCOL_INFO proto;

void set_reason(struct wsd_sock *s, enum wsd_reason r);
/*
 * The policy file's word on s (switch/policy.h, wsd.conf(5)), taken once,
 * by the side that would ask for the upgrade (upgrade_maybe) and by the
 * side that would grant it (wsd_upgrade_accepted, server_attach): each
 * end decides for itself.  POLICY_TCP: this call kept s on TCP
 * (no_upgrade, why_not R_POLICY), and the caller publishes the reason;
 * POLICY_LATER: s's addresses, which a rule looks at, are not known yet
 * (a connect under way), so ask again at the next call; POLICY_OK
 * otherwise (also when s was kept on TCP before, for any reason).
 */
enum policy_word { POLICY_OK, POLICY_TCP, POLICY_LATER };
enum policy_word policy_check(struct wsd_sock *s);
/* The policy keeps every connection we accept on port on TCP, whoever the peer. */
bool policy_port_tcp(uint16_t port);
/* An address as wsd stat keeps it (an IPv4-mapped IPv6 one as IPv4). */
void to_addr(const struct sockaddr_storage *ss, struct wsd_stat_addr *a);
/* The 4-tuple of a connected socket, learnt once (and published). */
int learn_tuple(struct wsd_sock *s);
bool same(const struct wsd_stat_addr *a, const struct wsd_stat_addr *b);
int send_msg(SOCKET ws, struct wsd_hello *h);
/* ...waiting ms at most, and no longer once *gone (when not NULL) is true. */
int recv_msg(SOCKET *wsp, struct wsd_hello *h, int ms, const _Atomic bool *gone,
	     struct wsd_hello *first);
enum wsd_path path_of(SOCKET ws);
/* The process at ws's other end, as the kernel named it (shm), is pid (the one its HELLO gave). */
bool peer_pid_is(SOCKET ws, uint32_t pid);
/*
 * registry.c.  registry_moved: *shared when the registration of port is
 * shared with fork children, and then the port of the child's own registry
 * that noted t's connection (t may be NULL), else 0.  registry_boxes:
 * channels made through port's registries may grant mailbox entries (it
 * is neither shared nor a child's own).  registry_atfork_child: the
 * registrations after fork, in the child.
 */
uint16_t registry_moved(uint16_t port, const struct wsd_tuple *t, bool *shared);
/* In a fork child: the port of the sibling's own registry that noted t's connection, or 0. */
uint16_t registry_sibling(uint16_t port, uint16_t side, const struct wsd_tuple *t);
bool registry_boxes(uint16_t port);
/*
 * registry.c: publish (on) or withdraw, through port's registry, the
 * rendezvous entry for a connection accepted from peer (SIO_WSP_PUBLISH);
 * 0 or -1.  accept.c: the rendezvous side of an accepted connection's
 * publication, at its accept and at its upgrade or close; and, for a
 * request that came through the directory, t's server end made that of the
 * connection published for t's client on port (false: none).
 */
int registry_publish(uint16_t port, const struct sockaddr *peer, socklen_t len, bool on);
void accept_publish(struct wsd_sock *s, bool on);
bool accept_rdv_server(struct wsd_tuple *t, uint16_t port);
void registry_atfork_child(void);
/*
 * connect.c: the connection stays on TCP, or is asked again (busy,
 * shared, moved), for why; a refusal's moved port followed (once).
 */
void connect_fail(struct wsd_sock *s, enum wsd_reason why);
enum wsd_reason connect_follow(struct wsd_sock *s, enum wsd_reason why, uint32_t port);
/*
 * open.c: s's upgrade as an OPEN message on ch; or posted in a grant of
 * the peer's mailbox (shm), false when there is none; fork, in the child.
 */
void open_send(struct wsd_sock *s, struct wsd_chan *ch, const struct wsd_tuple *t);
bool open_post(struct wsd_sock *s, struct wsd_chan *ch, const struct wsd_tuple *t);
/* s's posted OPEN: its answer taken if there (spin: waited for, and given up in time) */
void open_box_wait(struct wsd_sock *s, bool spin, bool to_tcp);
void open_atfork_child(void);
/* accept.c: a request an acceptor took, its HELLO awaited on a thread of its own */
void accept_handshake(SOCKET ws, const struct wsd_tuple *t);

/* connect.c: SPI socket ws's peer runs as a user the policy pairs with (peer-users) */
bool peer_user_ok(SOCKET ws);

void refuse(SOCKET ws, enum wsd_reason why);
void refuse_port(SOCKET ws, enum wsd_reason why, uint16_t port);
void decline(struct wsd_chan *ch, uint64_t req, enum wsd_reason why);
/* The DECLINE of request req, for reason why (a message, or a mailbox entry's answer). */
struct wsd_chmsg decline_msg(uint64_t req, enum wsd_reason why);
void drop(SOCKET ws);
/* Urgent data waits on the socket: no handover count could be right. */
bool urgent_seen(const struct wsd_sock *s);

/*
 * A channel to make ahead (probe.c): a short connection to a process on
 * this host ended before it upgraded, and later ones would go by channel
 * from their first byte.  to: the peer's registry; key: its address.
 */
struct probe_job {
	struct sockaddr_storage to;
	socklen_t tolen;
	struct wsd_stat_addr key;
};
bool probe_queue(const struct probe_job *p);            /* connect.c: the worker's */
/* The registry of s's peer: its address and port (an IPv4 one as IPv4). */
socklen_t peer_addr(const struct wsd_sock *s, struct sockaddr_storage *to);
void probe_done(const struct probe_job *p, enum wsd_reason why);  /* the worker's: R_NONE made */
void probe_atfork_child(void);
/*
 * The peer at key answered why for one connection, and would for each
 * (R_SHARED, R_POLICY, R_ACCESS): none of its connections asks for a
 * while, each stays on TCP with that reason (probe_refusal: R_NONE when
 * it may ask).
 */
void probe_refused(const struct wsd_stat_addr *key, enum wsd_reason why);
enum wsd_reason probe_refusal(const struct wsd_stat_addr *key);
/* p is an address of this host as seen from l (loopback, or l itself). */
bool probe_local(const struct wsd_stat_addr *p, const struct wsd_stat_addr *l);
/* a connection answered R_SHARED closed before asking again; s (ours) upgraded */
void probe_shared_lost(const struct wsd_stat_addr *key);
void probe_upgraded(struct wsd_sock *s);
/*
 * key's registry sent a connection on to its port port (R_MOVED): later
 * connections to key ask there first, for a while (probe_routed: that
 * port, or 0).  missed: one asked there was not there; not again for a
 * while.
 */
void probe_route(const struct wsd_stat_addr *key, uint16_t port, bool missed);
uint16_t probe_routed(const struct wsd_stat_addr *key);

void accept_chan_dead(struct wsd_chan *ch);
/*
 * port's registry became shared: its requests in hand answered moved or
 * shared; side (a fork child's own registry): those a sibling noted, moved.
 */
void accept_pending_reshare(uint16_t port, uint16_t side);
void accept_atfork_child(void);
void connect_atfork_child(void);

#endif /* WSD_SWITCH_UPGRADE_INT_H */
