/*
 * pause: the sandbox ("infra") container of every pod in the test environment.
 *
 * No registry is reachable from our machines, so we cannot pull
 * registry.k8s.io/pause; devenv compiles this file with `gcc -static -O2`
 * and packs the binary into an OCI image under the pause image names.
 *
 * What a sandbox process must do:
 *   - hold the pod's namespaces open by simply staying alive;
 *   - exit 0 promptly on SIGTERM/SIGINT, so that StopPodSandbox is quick;
 *   - reap zombies: when the pod shares one PID namespace this process is
 *     PID 1 of it and inherits every orphaned child.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_terminate(int sig) {
    (void)sig;
    _exit(0);
}

static void on_child(int sig) {
    (void)sig;
    int saved = errno; /* waitpid may clobber errno of the interrupted code */
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

static void install(int sig, void (*handler)(int), int flags) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = handler;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    if (sigaction(sig, &sa, NULL) < 0) {
        perror("pause: sigaction");
        exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        printf("pause (nodeagent devenv)\n");
        return 0;
    }
    if (getpid() != 1) {
        /* Harmless, but in a pod it means the PID namespace is not ours. */
        fprintf(stderr, "pause: warning: not running as PID 1\n");
    }
    install(SIGINT, on_terminate, 0);
    install(SIGTERM, on_terminate, 0);
    /* SA_NOCLDSTOP: stopped children are not zombies, nothing to reap. */
    install(SIGCHLD, on_child, SA_NOCLDSTOP | SA_RESTART);

    for (;;) {
        pause();
    }
    return 42; /* not reached */
}
