/* The pod sandbox's process: holds the pod's namespaces, reaps what it is given, and
 * ends on SIGINT or SIGTERM (what the pause image of a cluster does). */
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

static void stop(int sig) {
    (void)sig;
    _exit(0);
}

int main(void) {
    signal(SIGINT, stop);
    signal(SIGTERM, stop);
    signal(SIGCHLD, reap);
    for (;;) {
        pause();
    }
}
