/*
 * JVMTI agent that writes /tmp/perf-<pid>.map for JDKs without `jcmd Compiler.perfmap` (8, 11).
 *
 * Loaded into a running JVM through the attach mechanism (`load` command; profiler/symbols/perfmap.py), or at
 * start with -agentpath. On every load it truncates the map, asks the JVM to replay all code already
 * compiled (GenerateEvents), then appends one line per compiled method and generated stub as they
 * appear, so the map stays current until the JVM exits:
 *
 *     <start hex> <size hex> Lcom/example/CpuSplit;::burnAlpha
 *
 * (perf-map-agent's spelling: class signature, "::", method name). Options (comma separated):
 * "sig" appends the method signature, e.g. "Lcom/example/CpuSplit;::burnAlpha(JJ)J".
 */
#include <jvmti.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

static pthread_mutex_t map_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *map_file;
static jvmtiEnv *agent_env;
static int with_signature;

static void open_map(void) {
    char path[64];
    snprintf(path, sizeof(path), "/tmp/perf-%d.map", (int)getpid());
    pthread_mutex_lock(&map_lock);
    if (map_file != NULL)
        fclose(map_file);
    map_file = fopen(path, "w");
    pthread_mutex_unlock(&map_lock);
}

static void write_entry(const void *start, jint size, const char *name) {
    if (start == NULL || size <= 0 || name == NULL)
        return;
    pthread_mutex_lock(&map_lock);
    if (map_file != NULL) {
        /* Flush per line: readers (the profiler) may read the map at any moment. */
        fprintf(map_file, "%lx %x %s\n", (unsigned long)start, (unsigned)size, name);
        fflush(map_file);
    }
    pthread_mutex_unlock(&map_lock);
}

static void JNICALL on_compiled_method_load(jvmtiEnv *jvmti, jmethodID method, jint code_size,
                                            const void *code_addr, jint map_length,
                                            const jvmtiAddrLocationMap *map, const void *compile_info) {
    (void)map_length; (void)map; (void)compile_info;
    jclass klass = NULL;
    char *class_sig = NULL, *method_name = NULL, *method_sig = NULL;
    if ((*jvmti)->GetMethodDeclaringClass(jvmti, method, &klass) != JVMTI_ERROR_NONE ||
        (*jvmti)->GetClassSignature(jvmti, klass, &class_sig, NULL) != JVMTI_ERROR_NONE ||
        (*jvmti)->GetMethodName(jvmti, method, &method_name, &method_sig, NULL) != JVMTI_ERROR_NONE) {
        write_entry(code_addr, code_size, "[unknown java method]");
    } else {
        size_t length = strlen(class_sig) + strlen(method_name) + strlen(method_sig) + 3;
        char *frame = malloc(length);
        if (frame != NULL) {
            snprintf(frame, length, "%s::%s%s", class_sig, method_name, with_signature ? method_sig : "");
            write_entry(code_addr, code_size, frame);
            free(frame);
        }
    }
    if (class_sig) (*jvmti)->Deallocate(jvmti, (unsigned char *)class_sig);
    if (method_name) (*jvmti)->Deallocate(jvmti, (unsigned char *)method_name);
    if (method_sig) (*jvmti)->Deallocate(jvmti, (unsigned char *)method_sig);
}

static void JNICALL on_dynamic_code_generated(jvmtiEnv *jvmti, const char *name, const void *address, jint length) {
    (void)jvmti;
    write_entry(address, length, name);
}

static jint start_agent(JavaVM *vm, const char *options) {
    with_signature = options != NULL && strstr(options, "sig") != NULL;
    open_map();
    if (agent_env == NULL) {
        jvmtiEnv *jvmti;
        if ((*vm)->GetEnv(vm, (void **)&jvmti, JVMTI_VERSION_1_0) != JNI_OK)
            return 1;
        jvmtiCapabilities caps;
        memset(&caps, 0, sizeof(caps));
        caps.can_generate_compiled_method_load_events = 1;
        if ((*jvmti)->AddCapabilities(jvmti, &caps) != JVMTI_ERROR_NONE)
            return 2;
        jvmtiEventCallbacks callbacks;
        memset(&callbacks, 0, sizeof(callbacks));
        callbacks.CompiledMethodLoad = on_compiled_method_load;
        callbacks.DynamicCodeGenerated = on_dynamic_code_generated;
        if ((*jvmti)->SetEventCallbacks(jvmti, &callbacks, sizeof(callbacks)) != JVMTI_ERROR_NONE)
            return 3;
        if ((*jvmti)->SetEventNotificationMode(jvmti, JVMTI_ENABLE, JVMTI_EVENT_COMPILED_METHOD_LOAD, NULL) !=
                JVMTI_ERROR_NONE ||
            (*jvmti)->SetEventNotificationMode(jvmti, JVMTI_ENABLE, JVMTI_EVENT_DYNAMIC_CODE_GENERATED, NULL) !=
                JVMTI_ERROR_NONE)
            return 4;
        agent_env = jvmti;
    }
    /* A second load (the profiler attaches again) rewrites the map from scratch with the same env. */
    (*agent_env)->GenerateEvents(agent_env, JVMTI_EVENT_DYNAMIC_CODE_GENERATED);
    (*agent_env)->GenerateEvents(agent_env, JVMTI_EVENT_COMPILED_METHOD_LOAD);
    return 0;
}

EXPORT JNIEXPORT jint JNICALL Agent_OnAttach(JavaVM *vm, char *options, void *reserved) {
    (void)reserved;
    return start_agent(vm, options);
}

EXPORT JNIEXPORT jint JNICALL Agent_OnLoad(JavaVM *vm, char *options, void *reserved) {
    (void)reserved;
    /* At start-up GenerateEvents finds nothing yet; the events arrive as code is generated. */
    return start_agent(vm, options);
}

EXPORT JNIEXPORT void JNICALL Agent_OnUnload(JavaVM *vm) {
    (void)vm;
    pthread_mutex_lock(&map_lock);
    if (map_file != NULL) {
        fclose(map_file);
        map_file = NULL;
    }
    pthread_mutex_unlock(&map_lock);
}
