/* tests/walls/probe.c — one include, the header its probe target names
 * (FERRY_PROBE_HEADER): it compiles only where that header is visible from
 * the probe's place (tests/walls/CMakeLists.txt).
 */
#include FERRY_PROBE_HEADER

int walls_probe(void);
int walls_probe(void) { return 0; }
