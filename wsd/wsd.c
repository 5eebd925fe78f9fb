/* SPDX-License-Identifier: MIT */
/* The wsd command: info, demo, run, stat, bench. */
#include <stdio.h>
#include <string.h>

#include "provider/internal.h"
#include "switch/policy.h"
#include "wsd/cmd.h"

static int usage(FILE *f)
{
	fprintf(f, "usage: wsd info\n"
		   "       wsd demo [--bytes N[K|M|G]] [--msg N[K|M]]\n"
		   "       wsd run [options] -- PROGRAM [ARGS...]\n"
		   "       wsd stat [--json] [PID...]\n"
		   "       wsd bench [--quick] [--rounds N] [--transport T] [--peer ADDRESS]\n"
		   "                 [--port N] [--svg FILE] | wsd bench --serve [--port N]\n"
		   "see wsd(1)\n");
	return f == stderr ? 2 : 0;
}

/*
 * The policy a program started here would follow (wsd.conf(5)): its file,
 * each rule with its line, and the default; or why there is none.
 */
static void print_policy(void)
{
	static struct wsd_policy pol;   /* large: a table of rules */
	char text[WSD_POLICY_LINE + 64];

	wsd_policy_read(&pol);
	if (!pol.path[0]) {
		printf("policy: none (WSD_CONF is empty): every connection may be accelerated\n");
		return;
	}
	if (pol.broken) {
		if (pol.err_line)
			printf("policy: %s:%u: %s\n", pol.path, pol.err_line, pol.err);
		else
			printf("policy: %s: %s\n", pol.path, pol.err);
		printf("  every connection stays on TCP (reason policy)\n");
		return;
	}
	if (!pol.found) {
		printf("policy: %s (not there): every connection may be accelerated\n", pol.path);
		return;
	}
	printf("policy: %s\n", pol.path);
	for (unsigned i = 0; i < pol.nrules; i++) {
		wsd_policy_rule_text(&pol.rule[i], text, sizeof(text));
		printf("  line %-4u %s\n", pol.rule[i].line, text);
	}
	if (pol.def_line)
		printf("  line %-4u default %s\n", pol.def_line, wsd_policy_action_name(pol.def));
	else
		printf("  default   %s (no default line)\n", wsd_policy_action_name(pol.def));
	if (pol.users_line) {
		printf("  line %-4u peer-users", pol.users_line);
		if (pol.users != WSD_PEER_USERS_LIST)
			printf(" %s", pol.users == WSD_PEER_USERS_ANY ? "any" : "same");
		for (unsigned i = 0; i < pol.nusers; i++)
			printf(" %u", pol.user[i]);
		printf("\n");
	} else {
		printf("  peer-users any (no peer-users line)\n");
	}
}

static int cmd_info(void)
{
	static const char *const names[] = { "shm", "verbs" };
	size_t n;
	const struct wsd_param *p = wsd_params(&n);

	printf("transports:\n");
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		struct nd_adapter *ad;
		struct nd_adapter_info info;
		nd_status st = nd_adapter_open(names[i], &ad);

		if (st != ND_SUCCESS) {
			printf("  %-6s unavailable (%s)\n", names[i],
			       st == ND_NOT_SUPPORTED ? "no usable device" : nd_strstatus(st));
			continue;
		}
		nd_adapter_query(ad, &info);
		printf("  %-6s sge %u/%u  requests %u/%u  cq %u  max transfer %llu  windows %u"
		       "  rdma threshold %llu%s\n", info.transport, info.max_outbound_sge,
		       info.max_inbound_sge, info.max_outbound_requests,
		       info.max_inbound_requests, info.max_cq_entries,
		       (unsigned long long)info.max_transfer_length, info.max_windows,
		       (unsigned long long)info.rdma_threshold,
		       info.flags & ND_ADAPTER_FLAG_RDMA_READ_LOCAL_INVALIDATE_SUPPORTED ?
		       "  read-local-invalidate" : "");
		nd_adapter_close(ad);
	}
	printf("runtime parameters:\n");
	for (size_t i = 0; i < n; i++)
		printf("  %-18s %-7s default %-8s now %-8s %s\n", p[i].name, p[i].type, p[i].def,
		       wsd_param_str(p[i].name), p[i].help);
	print_policy();
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return usage(stderr);
	if (!strcmp(argv[1], "info"))
		return cmd_info();
	if (!strcmp(argv[1], "demo"))
		return cmd_demo(argc - 1, argv + 1);
	if (!strcmp(argv[1], "run"))
		return cmd_run(argc - 1, argv + 1);
	if (!strcmp(argv[1], "stat"))
		return cmd_stat(argc - 1, argv + 1);
	if (!strcmp(argv[1], "bench"))
		return cmd_bench(argc - 1, argv + 1);
	if (!strcmp(argv[1], "bench-worker"))   /* wsd bench's own programs */
		return cmd_bench_worker(argc - 1, argv + 1);
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help"))
		return usage(stdout);
	fprintf(stderr, "wsd: unknown command '%s'\n", argv[1]);
	return usage(stderr);
}
