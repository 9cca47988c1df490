/* A crafted "java" (issue 27's hostile process): it maps the crafted libjvm.so (fake_libjvm.c), names a
 * thread with 10 KB through HotSpot's naming function, burns some CPU, and answers HotSpot's attach
 * protocol (trigger file + SIGQUIT, /tmp/.java_pid<pid>) with a reply of tens of MB whose thread-dump
 * lines carry 10 KB names. Prints READY once its listener can be triggered. Built by
 * tests/fixtures/hostile.py with  gcc -o bin/java fake_java.c -Llib/server -ljvm -Wl,-rpath,... -lpthread
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

void _ZN2os22set_native_thread_nameEPKc(const char *name);

#define NAME_BYTES (10 * 1024)
#define REPLY_BYTES (40 << 20)

static volatile sig_atomic_t quit_seen;
static char long_name[NAME_BYTES + 1];

static void on_sigquit(int sig) { (void)sig; quit_seen = 1; }

static void *burn(void *arg) {
    (void)arg;
    volatile unsigned long counter = 0;
    for (;;) {
        struct timespec start, now;
        clock_gettime(CLOCK_MONOTONIC, &start);
        do {  /* 20 ms of work, 80 ms of sleep */
            for (int i = 0; i < 10000; i++) counter++;
            clock_gettime(CLOCK_MONOTONIC, &now);
        } while ((now.tv_sec - start.tv_sec) * 1000000000L + (now.tv_nsec - start.tv_nsec) < 20000000L);
        usleep(80000);
    }
    return NULL;
}

static void *serve(void *arg) {
    int server = (int)(long)arg;
    char line[NAME_BYTES + 64];
    int length = snprintf(line, sizeof line, "\"%s\" #1 prio=5 os_prio=0 tid=0x1 nid=0x%x runnable\n",
                          long_name, (unsigned)getpid());
    for (;;) {
        int conn = accept(server, NULL, NULL);
        if (conn < 0) continue;
        char request[4096];
        (void)!read(conn, request, sizeof request);
        (void)!write(conn, "0\n", 2);
        for (long sent = 0; sent < REPLY_BYTES; sent += length)
            if (write(conn, line, length) != length) break;
        close(conn);
    }
    return NULL;
}

static void start_listener(void) {
    char trigger[64], tmp_trigger[64];
    struct stat st;
    snprintf(trigger, sizeof trigger, ".attach_pid%d", getpid());
    snprintf(tmp_trigger, sizeof tmp_trigger, "/tmp/.attach_pid%d", getpid());
    if (stat(trigger, &st) != 0 && stat(tmp_trigger, &st) != 0) return;
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    snprintf(address.sun_path, sizeof address.sun_path, "/tmp/.java_pid%d", getpid());
    unlink(address.sun_path);
    int server = socket(AF_UNIX, SOCK_STREAM, 0);
    if (bind(server, (struct sockaddr *)&address, sizeof address) != 0 || listen(server, 4) != 0) return;
    pthread_t thread;
    pthread_create(&thread, NULL, serve, (void *)(long)server);
}

int main(void) {
    memset(long_name, 'N', NAME_BYTES);
    prctl(PR_SET_NAME, "fake-jvm-main");
    signal(SIGQUIT, on_sigquit);
    signal(SIGPIPE, SIG_IGN);  /* a reader that stops early must not end the flood's source */
    pthread_t burner;
    pthread_create(&burner, NULL, burn, NULL);
    printf("READY\n");
    fflush(stdout);
    int listening = 0;
    for (;;) {
        _ZN2os22set_native_thread_nameEPKc(long_name);
        if (quit_seen && !listening) {
            start_listener();
            listening = 1;
        }
        usleep(100000);
    }
}
