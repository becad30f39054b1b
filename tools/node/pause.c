/* The sandbox ("pause") process of every Pod on the real node: it holds the Pod's namespaces and
 * does nothing else until it is told to stop. No registry can be reached here, so it is built here. */
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

int main(void) {
    signal(SIGINT, stop);
    signal(SIGTERM, stop);
    for (;;) pause();
}
