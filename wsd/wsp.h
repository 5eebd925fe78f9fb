/* SPDX-License-Identifier: MIT */
/*
 * wsd SAN service provider interface: the Winsock Direct SPI (WSP*) over
 * the endpoint layer, with overlapped completion and completion ports on
 * io_uring.  The switch calls it through the procedure table WSPStartup
 * fills; integrators and tests may call the functions directly.
 *
 * Conventions: a WSP* call returns 0 (or a value) on success and
 * SOCKET_ERROR (or INVALID_SOCKET / FALSE) on failure with *lpErrno set to a
 * WSA code.  Contracts are in each function's man page; wsd-spi(7) is the
 * overview.
 */
#ifndef WSD_WSP_H
#define WSD_WSP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- types ------------------------------------------------------------- */

typedef uintptr_t SOCKET;
#define INVALID_SOCKET ((SOCKET)~(uintptr_t)0)
#define SOCKET_ERROR (-1)

typedef struct WSABUF {
	uint32_t len;
	char *buf;
} WSABUF;

/* A buffer and the handle WSPRegisterMemory returned for it. */
typedef struct WSABUFEX {
	uint32_t len;
	char *buf;
	uint64_t handle;
} WSABUFEX;

/*
 * WSPAccept's condition function: shown a connection request's caller data
 * (the connecting side's WSPConnect lpCallerData) before anything is set up,
 * it answers CF_ACCEPT, CF_REJECT or CF_DEFER and may fill lpCalleeData
 * (up to its len) for the caller's lpCalleeData.
 */
#define CF_ACCEPT 0
#define CF_REJECT 1
#define CF_DEFER  2
typedef int (*LPCONDITIONPROC)(WSABUF *lpCallerId, WSABUF *lpCallerData, void *lpSQOS,
			       void *lpGQOS, WSABUF *lpCalleeId, WSABUF *lpCalleeData,
			       unsigned *g, uintptr_t dwCallbackData);

/*
 * Overlapped request state.  While a request is outstanding Internal is
 * WSA_IO_PENDING; when it completes, Internal holds 0 or a WSA code and
 * InternalHigh the bytes moved.  hEvent with its low bit set asks for no
 * completion notification: the caller polls WSPGetOverlappedResult.
 */
typedef struct WSAOVERLAPPED {
	uintptr_t Internal;
	uintptr_t InternalHigh;
	uint32_t Offset;
	uint32_t OffsetHigh;
	void *hEvent;
} WSAOVERLAPPED;

typedef struct WSATHREADID {
	void *ThreadHandle;
	uintptr_t Reserved;
} WSATHREADID;

typedef void (*LPWSAOVERLAPPED_COMPLETION_ROUTINE)(uint32_t error, uint32_t bytes,
						   WSAOVERLAPPED *overlapped, uint32_t flags);

/* ---- error codes ------------------------------------------------------- */

#define WSA_INVALID_HANDLE      6
#define WSA_OPERATION_ABORTED   995
#define WSA_IO_INCOMPLETE       996
#define WSA_IO_PENDING          997
#define WSAEINTR                10004
#define WSAEACCES               10013
#define WSAEFAULT               10014
#define WSAEINVAL               10022
#define WSAEWOULDBLOCK          10035
#define WSAENOTSOCK             10038
#define WSAEMSGSIZE             10040
#define WSAENOPROTOOPT          10042
#define WSAEPROTONOSUPPORT      10043
#define WSAEOPNOTSUPP           10045
#define WSAEAFNOSUPPORT         10047
#define WSAEADDRINUSE           10048
#define WSAENETDOWN             10050
#define WSAECONNABORTED         10053
#define WSAECONNRESET           10054
#define WSAENOBUFS              10055
#define WSAEISCONN              10056
#define WSAENOTCONN             10057
#define WSAESHUTDOWN            10058
#define WSAETIMEDOUT            10060
#define WSAECONNREFUSED         10061
#define WSATRY_AGAIN            11002
#define WSAVERNOTSUPPORTED      10092

/* ---- options, flags ---------------------------------------------------- */

#define SOL_WSP                 0x5753          /* level for the SAN options */
#define SO_MAX_MSG_SIZE         0x2003          /* largest WSPSend, bytes */
#define SO_RDMA_THRESHOLD_SIZE  0x700C          /* size above which RDMA pays */
#define SO_MAX_RDMA_SIZE        0x700D          /* largest WSPRdmaRead/Write */
/*
 * Listening socket: the descriptor of the program's TCP listener on the
 * same port, named to connectors.  Connecting socket: 1 = the listener's
 * process must hold a TCP listener on the dialled port (shm; verbs ignores).
 */
#define SO_WSP_TCP_LISTENER     0x7100
/*
 * Connected socket, read-only: the peer's process id as the kernel gave it
 * when the connection was made (shm); verbs cannot know it (WSAENOPROTOOPT).
 */
#define SO_WSP_PEER_PID         0x7101
/*
 * Connecting socket: the TCP port the SO_WSP_TCP_LISTENER check asks about
 * in place of the port dialled (0, the default: the port dialled), for a
 * listener that serves a TCP port other than its own (a fork child's).
 */
#define SO_WSP_TCP_PORT         0x7102
/*
 * Listening socket: WSPAccept waits at most this many milliseconds for a
 * request, then fails with WSAETIMEDOUT (0, the default: until one comes).
 */
#define SO_WSP_ACCEPT_MS        0x7103
/*
 * Listening socket, read-only: -1 when the transport's rendezvous name
 * for the port was free; else the uid of the other user who held it, the
 * listener then reachable under an alternate name (shm; verbs: -1).
 */
#define SO_WSP_NAME_TAKEN       0x7104
/*
 * Listening or connecting socket: 1 = pair with a process of another user
 * too, where the peer's socket says so as well (shm: by copy, without
 * access to each other's memory: WSPRdmaRead, WSPRdmaWrite and memory
 * registered for RDMA fail on such a connection); 0, the default: our
 * own user only.
 */
#define SO_WSP_PEER_USERS       0x7105
/*
 * Connected socket, read-only: the peer's user id as the kernel gave it
 * when the connection was made (shm); verbs cannot know it (WSAENOPROTOOPT).
 */
#define SO_WSP_PEER_UID         0x7106
/*
 * Connecting socket, set only: our end of the TCP connection this one
 * stands for (a struct sockaddr_in or sockaddr_in6 of the socket's
 * family).  A listener of another user that holds no TCP listener may then
 * show that connection's other end instead (shm).
 */
#define SO_WSP_TCP_FROM         0x7107
/*
 * Connected socket, read-only: 1 when the connection was made through the
 * rendezvous directory (WSD_RENDEZVOUS_DIR), from or to another network
 * namespace (shm): by copy whatever the users, and the peer's process
 * unnamed (SO_WSP_PEER_PID fails); else 0.
 */
#define SO_WSP_RENDEZVOUS       0x7108

#define SD_RECEIVE 0
#define SD_SEND    1
#define SD_BOTH    2

/* registration access */
#define MEM_READ        1u
#define MEM_WRITE       2u
#define MEM_READWRITE   3u

#define WSP_VERSION     0x0202u                 /* 2.2 */

/* ---- provider ---------------------------------------------------------- */

struct wsp_provider;

/* What WSPStartup reports about the provider instance. */
typedef struct WSPDATA {
	uint16_t wVersion;
	uint16_t wHighVersion;
	char szDescription[64];
} WSPDATA;

/* Names the provider instance to WSPSocket; WSPStartup fills it. */
typedef struct WSAPROTOCOL_INFO {
	struct wsp_provider *provider;
	char transport[16];
} WSAPROTOCOL_INFO;

/* Calls the provider makes into its caller (the switch). */
typedef struct WSPUPCALLTABLE {
	size_t cbSize;
	/*
	 * Complete an overlapped request that asked for notification.  NULL
	 * means the provider's own: post to the completion port the socket is
	 * associated with (wsd_port_associate), or nothing when it has none.
	 */
	int (*lpWPUCompleteOverlappedRequest)(SOCKET s, WSAOVERLAPPED *overlapped,
					      uint32_t error, uint32_t bytes, int *lpErrno);
} WSPUPCALLTABLE;

typedef struct WSPPROC_TABLE {
	size_t cbSize;        /* first member: the size the provider filled */
	SOCKET (*lpWSPSocket)(int, int, int, WSAPROTOCOL_INFO *, unsigned, uint32_t, int *);
	int (*lpWSPBind)(SOCKET, const struct sockaddr *, socklen_t, int *);
	int (*lpWSPListen)(SOCKET, int, int *);
	SOCKET (*lpWSPAccept)(SOCKET, struct sockaddr *, socklen_t *, LPCONDITIONPROC, uintptr_t,
			      int *);
	int (*lpWSPConnect)(SOCKET, const struct sockaddr *, socklen_t, const WSABUF *, WSABUF *,
			    void *, void *, int *);
	int (*lpWSPSend)(SOCKET, WSABUF *, uint32_t, uint32_t *, uint32_t, WSAOVERLAPPED *,
			 LPWSAOVERLAPPED_COMPLETION_ROUTINE, WSATHREADID *, int *);
	int (*lpWSPRecv)(SOCKET, WSABUF *, uint32_t, uint32_t *, uint32_t *, WSAOVERLAPPED *,
			 LPWSAOVERLAPPED_COMPLETION_ROUTINE, WSATHREADID *, int *);
	int (*lpWSPShutdown)(SOCKET, int, int *);
	int (*lpWSPCloseSocket)(SOCKET, int *);
	int (*lpWSPGetSockOpt)(SOCKET, int, int, void *, socklen_t *, int *);
	int (*lpWSPSetSockOpt)(SOCKET, int, int, const void *, socklen_t, int *);
	int (*lpWSPIoctl)(SOCKET, uint32_t, void *, uint32_t, void *, uint32_t, uint32_t *,
			  WSAOVERLAPPED *, LPWSAOVERLAPPED_COMPLETION_ROUTINE, WSATHREADID *,
			  int *);
	int (*lpWSPGetOverlappedResult)(SOCKET, WSAOVERLAPPED *, uint32_t *, int, uint32_t *,
					int *);
	uint64_t (*lpWSPRegisterMemory)(SOCKET, void *, uint32_t, uint32_t, int *);
	int (*lpWSPDeregisterMemory)(SOCKET, uint64_t, int *);
	int (*lpWSPRegisterRdmaMemory)(SOCKET, void *, uint32_t, uint32_t, void *, uint32_t *,
				       int *);
	int (*lpWSPDeregisterRdmaMemory)(SOCKET, void *, uint32_t, int *);
	int (*lpWSPMemoryRegistrationCacheCallback)(void *, size_t, int *);
	int (*lpWSPRdmaRead)(SOCKET, WSABUFEX *, uint32_t, void *, uint32_t, uint32_t,
			     uint32_t *, uint32_t, WSAOVERLAPPED *,
			     LPWSAOVERLAPPED_COMPLETION_ROUTINE, WSATHREADID *, int *);
	int (*lpWSPRdmaWrite)(SOCKET, WSABUFEX *, uint32_t, void *, uint32_t, uint32_t,
			      uint32_t *, uint32_t, WSAOVERLAPPED *,
			      LPWSAOVERLAPPED_COMPLETION_ROUTINE, WSATHREADID *, int *);
	int (*lpWSPCleanup)(struct wsp_provider *, int *);
} WSPPROC_TABLE;

/* Size of an RDMA buffer descriptor (WSPRegisterRdmaMemory). */
#define WSP_RDMA_DESCRIPTOR_SIZE 32u

/* Most buffers one WSPSend, WSPRecv, WSPRdmaRead or WSPRdmaWrite takes. */
#define WSP_MAX_BUFFERS 16u

int WSPStartup(uint16_t wVersionRequested, WSPDATA *lpWSPData,
	       WSAPROTOCOL_INFO *lpProtocolInfo, const WSPUPCALLTABLE *lpUpcallTable,
	       WSPPROC_TABLE *lpProcTable);
int WSPCleanup(struct wsp_provider *provider, int *lpErrno);

/* ---- sockets ----------------------------------------------------------- */

SOCKET WSPSocket(int af, int type, int protocol, WSAPROTOCOL_INFO *lpProtocolInfo,
		 unsigned g, uint32_t dwFlags, int *lpErrno);
int WSPBind(SOCKET s, const struct sockaddr *name, socklen_t namelen, int *lpErrno);
int WSPListen(SOCKET s, int backlog, int *lpErrno);
SOCKET WSPAccept(SOCKET s, struct sockaddr *addr, socklen_t *addrlen,
		 LPCONDITIONPROC lpfnCondition, uintptr_t dwCallbackData, int *lpErrno);
int WSPConnect(SOCKET s, const struct sockaddr *name, socklen_t namelen,
	       const WSABUF *lpCallerData, WSABUF *lpCalleeData, void *lpSQOS, void *lpGQOS,
	       int *lpErrno);
int WSPSend(SOCKET s, WSABUF *lpBuffers, uint32_t dwBufferCount,
	    uint32_t *lpNumberOfBytesSent, uint32_t dwFlags, WSAOVERLAPPED *lpOverlapped,
	    LPWSAOVERLAPPED_COMPLETION_ROUTINE lpCompletionRoutine, WSATHREADID *lpThreadId,
	    int *lpErrno);
int WSPRecv(SOCKET s, WSABUF *lpBuffers, uint32_t dwBufferCount,
	    uint32_t *lpNumberOfBytesRecvd, uint32_t *lpFlags, WSAOVERLAPPED *lpOverlapped,
	    LPWSAOVERLAPPED_COMPLETION_ROUTINE lpCompletionRoutine, WSATHREADID *lpThreadId,
	    int *lpErrno);
int WSPShutdown(SOCKET s, int how, int *lpErrno);
int WSPCloseSocket(SOCKET s, int *lpErrno);
int WSPGetSockOpt(SOCKET s, int level, int optname, void *optval, socklen_t *optlen,
		  int *lpErrno);
int WSPSetSockOpt(SOCKET s, int level, int optname, const void *optval, socklen_t optlen,
		  int *lpErrno);
int WSPIoctl(SOCKET s, uint32_t dwIoControlCode, void *lpvInBuffer, uint32_t cbInBuffer,
	     void *lpvOutBuffer, uint32_t cbOutBuffer, uint32_t *lpcbBytesReturned,
	     WSAOVERLAPPED *lpOverlapped, LPWSAOVERLAPPED_COMPLETION_ROUTINE lpCompletionRoutine,
	     WSATHREADID *lpThreadId, int *lpErrno);
int WSPGetOverlappedResult(SOCKET s, WSAOVERLAPPED *lpOverlapped, uint32_t *lpcbTransfer,
			   int fWait, uint32_t *lpdwFlags, int *lpErrno);

/* WSPIoctl codes */
#define SIO_WSP_TRANSPORT 0x58000001u  /* out: the transport's name, NUL-terminated */
/*
 * Connected socket, between users (SO_WSP_PEER_UID not ours) on shm:
 * hand the peer a descriptor (in: an int), or take the oldest one it
 * handed us (out: an int, ours to close); WSAEWOULDBLOCK while there is
 * none (or, sending, the peer has not read the ones before),
 * WSAEOPNOTSUPP on any other connection.
 */
#define SIO_WSP_SEND_FD   0x58000002u
#define SIO_WSP_RECV_FD   0x58000003u
/*
 * Listening socket, shm with a rendezvous directory: publish (or withdraw)
 * the entry that leads a connector of another network namespace whose end
 * of a TCP connection is the address given (in: a struct sockaddr_in or
 * sockaddr_in6) to this listener; WSAEOPNOTSUPP without a directory,
 * WSAEADDRINUSE when another user's entry holds the name.
 */
#define SIO_WSP_PUBLISH   0x58000004u
#define SIO_WSP_UNPUBLISH 0x58000005u

/* ---- memory ------------------------------------------------------------ */

uint64_t WSPRegisterMemory(SOCKET s, void *lpBuffer, uint32_t dwBufferLength,
			   uint32_t dwFlags, int *lpErrno);
int WSPDeregisterMemory(SOCKET s, uint64_t handle, int *lpErrno);
int WSPRegisterRdmaMemory(SOCKET s, void *lpBuffer, uint32_t dwBufferLength,
			  uint32_t dwFlags, void *lpRdmaBufferDescriptor,
			  uint32_t *lpdwDescriptorLength, int *lpErrno);
int WSPDeregisterRdmaMemory(SOCKET s, void *lpRdmaBufferDescriptor,
			    uint32_t dwDescriptorLength, int *lpErrno);
int WSPMemoryRegistrationCacheCallback(void *lpvAddress, size_t Size, int *lpErrno);
/*
 * The process promises that the registration cache hears of all memory
 * going away, through WSPMemoryRegistrationCacheCallback (libwsd-hooks.so
 * and wsd run's preload make the promise for it): from now on the cache
 * keeps registrations after their last user.  Returns 0.
 */
int wsd_rcache_enable(void);

/* ---- RDMA -------------------------------------------------------------- */

int WSPRdmaRead(SOCKET s, WSABUFEX *lpBuffers, uint32_t dwBufferCount,
		void *lpTargetBufferDescriptor, uint32_t dwTargetDescriptorLength,
		uint32_t dwTargetBufferOffset, uint32_t *lpdwNumberOfBytesRead,
		uint32_t dwFlags, WSAOVERLAPPED *lpOverlapped,
		LPWSAOVERLAPPED_COMPLETION_ROUTINE lpCompletionRoutine,
		WSATHREADID *lpThreadId, int *lpErrno);
int WSPRdmaWrite(SOCKET s, WSABUFEX *lpBuffers, uint32_t dwBufferCount,
		 void *lpTargetBufferDescriptor, uint32_t dwTargetDescriptorLength,
		 uint32_t dwTargetBufferOffset, uint32_t *lpdwNumberOfBytesWritten,
		 uint32_t dwFlags, WSAOVERLAPPED *lpOverlapped,
		 LPWSAOVERLAPPED_COMPLETION_ROUTINE lpCompletionRoutine,
		 WSATHREADID *lpThreadId, int *lpErrno);

/* ---- completion ports (io_uring) ----------------------------------------- */

struct wsd_port;

int wsd_port_create(struct wsd_port **port);
int wsd_port_close(struct wsd_port *port);
int wsd_port_associate(struct wsd_port *port, SOCKET s, uintptr_t key);
/*
 * Wait up to timeout_ms (< 0: forever) for one completion: 1 with its
 * bytes, key and overlapped structure, 0 on timeout, or -errno.
 */
int wsd_port_wait(struct wsd_port *port, uint32_t *bytes, uintptr_t *key,
		  WSAOVERLAPPED **overlapped, int timeout_ms);
int wsd_port_post(struct wsd_port *port, uint32_t bytes, uintptr_t key,
		  WSAOVERLAPPED *overlapped);

#ifdef __cplusplus
}
#endif

#endif /* WSD_WSP_H */
